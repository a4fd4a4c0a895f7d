"""Small builders for job specs in tests."""

from __future__ import annotations

from gateway.jobs.model import ChatMessage, JobSpec, NodeSpec, SamplingSpec


def make_node(
    node_id: str,
    prompt: str = "Say hi.",
    depends_on: tuple[str, ...] = (),
    sampling: SamplingSpec | None = None,
) -> NodeSpec:
    return NodeSpec(
        id=node_id,
        prompt_template=prompt,
        depends_on=depends_on,
        sampling=sampling or SamplingSpec(),
    )


def make_chat_node(
    node_id: str, *messages: tuple[str, str], depends_on: tuple[str, ...] = ()
) -> NodeSpec:
    return NodeSpec(
        id=node_id,
        messages=tuple(ChatMessage(role, content) for role, content in messages),
        depends_on=depends_on,
    )


def make_job(*nodes: NodeSpec, inputs: dict[str, str] | None = None) -> JobSpec:
    return JobSpec(nodes=nodes, inputs=inputs or {})


def make_map_reduce(num_chunks: int) -> JobSpec:
    """`num_chunks` map nodes over inputs chunk_i, then one reduce node over their outputs."""
    maps = [
        make_node(f"map_{i}", f"Summarise: {{{{inputs.chunk_{i}}}}}") for i in range(num_chunks)
    ]
    reduce_prompt = "Combine:\n" + "\n".join(
        f"- {{{{ map_{i}.output }}}}" for i in range(num_chunks)
    )
    reduce = make_node("reduce", reduce_prompt, depends_on=tuple(m.id for m in maps))
    return make_job(*maps, reduce, inputs={f"chunk_{i}": f"text {i}" for i in range(num_chunks)})
