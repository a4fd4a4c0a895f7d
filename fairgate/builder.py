"""Build job specs (DAGs of LLM calls) in code or read them from JSON.

`JobBuilder` collects inputs and nodes and emits a `fairgate.v1.JobSpec`; `map_reduce` and
`parallel_sample` are the two common shapes built with it. The builder checks only what it must
to build a well-formed message (one prompt per node, unique ids); the server validates the rest
and answers INVALID_ARGUMENT naming the offending field. JSON uses the protobuf JSON mapping
(see docs/JOBS.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Self

from google.protobuf import json_format

from fairgate.errors import JobSpecInvalid
from fairgate.v1 import gateway_pb2 as pb

MAP_INSTRUCTION = "Summarise the following text in two or three sentences."
REDUCE_INSTRUCTION = "Combine these summaries into one short, coherent summary."
VOTE_INSTRUCTION = (
    "Several answers to the same question follow. Reply with the answer most of them agree on."
)


class JobBuilder:
    """Chainable: `JobBuilder("name").input(...).node(...).node(...).build()`."""

    def __init__(
        self,
        name: str = "",
        *,
        inputs: Mapping[str, str] | None = None,
        idempotency_key: str = "",
        priority: int = 0,
        deadline: datetime | None = None,
    ) -> None:
        """`deadline` must be timezone-aware; nodes unfinished by then are cancelled."""
        self._spec = pb.JobSpec(
            name=name,
            inputs=dict(inputs or {}),
            idempotency_key=idempotency_key,
            priority=priority,
        )
        if deadline is not None:
            if deadline.tzinfo is None:
                raise JobSpecInvalid("deadline must be a timezone-aware datetime")
            self._spec.deadline.FromDatetime(deadline)
        self._ids: set[str] = set()

    def input(self, name: str, value: str) -> Self:
        """A value for `{{inputs.NAME}}` references; inserted verbatim, never re-scanned."""
        self._spec.inputs[name] = value
        return self

    def node(
        self,
        node_id: str,
        *,
        prompt: str | None = None,
        chat: Iterable[tuple[str, str]] | None = None,
        depends_on: str | Sequence[str] = (),
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        stop: str | Iterable[str] = (),
        seed: int | None = None,
        name: str = "",
        model: str = "",
    ) -> Self:
        """Add a call with a prompt template or chat messages `(role, content template)`.

        Templates use `{{inputs.NAME}}` and `{{NODE_ID.output}}` for nodes reachable
        through `depends_on` (one node id, or several). Sampling fields left None take the
        server's defaults; `model` empty: the gateway's default model.
        """
        if (prompt is None) == (chat is None):
            raise JobSpecInvalid(f"node {node_id!r}: give exactly one of prompt and chat")
        if node_id in self._ids:
            raise JobSpecInvalid(f"node {node_id!r} is defined twice")
        self._ids.add(node_id)
        sampling = sampling_spec(max_tokens, temperature, top_p, top_k, stop, seed)
        # a string is one parent: protobuf would take it as one parent per character
        parents = [depends_on] if isinstance(depends_on, str) else list(depends_on)
        node = pb.NodeSpec(
            id=node_id, depends_on=parents, sampling=sampling, name=name, model=model
        )
        if prompt is not None:
            node.prompt_template = prompt
        else:
            messages = [pb.ChatMessage(role=role, content=text) for role, text in chat or ()]
            node.chat.CopyFrom(pb.ChatPrompt(messages=messages))
        self._spec.nodes.append(node)
        return self

    def build(self) -> pb.JobSpec:
        """A copy of the spec built so far (the builder can go on)."""
        spec = pb.JobSpec()
        spec.CopyFrom(self._spec)
        return spec


def map_reduce(
    documents: Mapping[str, str],
    *,
    map_instruction: str = MAP_INSTRUCTION,
    reduce_instruction: str = REDUCE_INSTRUCTION,
    max_tokens: int | None = None,
    reduce_max_tokens: int | None = None,
    name: str = "map-reduce",
) -> pb.JobSpec:
    """One `map_<doc>` node per document (an input named after it), then one `reduce` node
    whose prompt holds every map output. Document names must be identifiers."""
    if not documents:
        raise JobSpecInvalid("map_reduce needs at least one document")
    builder = JobBuilder(name, inputs=documents)
    map_ids = []
    for doc in documents:
        map_ids.append(f"map_{doc}")
        prompt = f"{map_instruction}\n\n{{{{inputs.{doc}}}}}"
        builder.node(map_ids[-1], prompt=prompt, max_tokens=max_tokens, name="map")
    parts = [f"Summary {i}:\n{{{{{node}.output}}}}" for i, node in enumerate(map_ids, 1)]
    reduce_prompt = "\n\n".join([reduce_instruction, *parts])
    builder.node(
        "reduce",
        prompt=reduce_prompt,
        depends_on=map_ids,
        max_tokens=reduce_max_tokens,
        name="reduce",
    )
    return builder.build()


def parallel_sample(
    question: str,
    n: int,
    *,
    seeds: Sequence[int] | None = None,
    temperature: float = 0.8,
    max_tokens: int | None = None,
    vote_instruction: str = VOTE_INSTRUCTION,
    name: str = "parallel-sampling",
) -> pb.JobSpec:
    """`n` samples `sample_1..n` of one question (seeds 1..n unless given, at `temperature`),
    then a greedy `vote` node that reads every sample."""
    if n < 1:
        raise JobSpecInvalid("parallel_sample needs n >= 1")
    seeds = list(seeds) if seeds is not None else list(range(1, n + 1))
    if len(seeds) != n:
        raise JobSpecInvalid(f"got {len(seeds)} seeds for {n} samples")
    builder = JobBuilder(name, inputs={"question": question})
    sample_ids = [f"sample_{i}" for i in range(1, n + 1)]
    for sample_id, seed in zip(sample_ids, seeds, strict=True):
        builder.node(
            sample_id,
            prompt="{{inputs.question}}",
            temperature=temperature,
            seed=seed,
            max_tokens=max_tokens,
            name="sample",
        )
    answers = [f"Answer {i}:\n{{{{{s}.output}}}}" for i, s in enumerate(sample_ids, 1)]
    vote_prompt = "\n\n".join([vote_instruction, "Question:\n{{inputs.question}}", *answers])
    builder.node(
        "vote",
        prompt=vote_prompt,
        depends_on=sample_ids,
        temperature=0.0,
        max_tokens=max_tokens,
        name="vote",
    )
    return builder.build()


def job_from_json(text: str) -> pb.JobSpec:
    """A JobSpec from its protobuf JSON form; unknown fields are refused (JobSpecInvalid)."""
    try:
        return json_format.Parse(text, pb.JobSpec())
    except json_format.ParseError as exc:
        raise JobSpecInvalid(f"not a JobSpec: {exc}") from exc


def job_to_json(spec: pb.JobSpec) -> str:
    return json_format.MessageToJson(spec, indent=2)


def sampling_spec(
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    stop: str | Iterable[str],
    seed: int | None,
) -> pb.SamplingSpec:
    """A call's sampling; `stop` one string or several (a string is one stop, not one per
    character)."""
    stops = [stop] if isinstance(stop, str) else list(stop)
    return pb.SamplingSpec(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, stop=stops,
        seed=seed,
    )  # fmt: skip
