from __future__ import annotations

from fairgate.v1 import gateway_pb2 as pb
from gateway.gateway_protos import job_spec_from_proto, job_spec_to_proto, node_spec_from_proto
from gateway.jobs.model import ChatMessage, JobSpec, NodeSpec, SamplingSpec
from tests.gateway.jobs.factories import make_chat_node, make_node


def test_proto_fields_map_to_the_model() -> None:
    msg = pb.JobSpec(
        name="digest",
        nodes=[
            pb.NodeSpec(
                id="a",
                prompt_template="Sum up {{inputs.doc}}",
                sampling=pb.SamplingSpec(max_tokens=64, temperature=0.0, stop=["\n\n"], seed=7),
                name="summary",
            ),
            pb.NodeSpec(
                id="b",
                chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content="{{a.output}}")]),
                depends_on=["a"],
            ),
        ],
        inputs={"doc": "text"},
        idempotency_key="req-1",
        priority=3,
    )
    msg.deadline.seconds, msg.deadline.nanos = 1_700_000_000, 500_000_000
    assert job_spec_from_proto(msg) == JobSpec(
        name="digest",
        nodes=(
            NodeSpec(
                id="a",
                prompt_template="Sum up {{inputs.doc}}",
                sampling=SamplingSpec(max_tokens=64, temperature=0.0, stop=("\n\n",), seed=7),
                name="summary",
            ),
            NodeSpec(id="b", messages=(ChatMessage("user", "{{a.output}}"),), depends_on=("a",)),
        ),
        inputs={"doc": "text"},
        idempotency_key="req-1",
        priority=3,
        deadline_unix_s=1_700_000_000.5,
    )


def test_unset_is_none_not_zero() -> None:
    spec = job_spec_from_proto(pb.JobSpec(nodes=[pb.NodeSpec(id="a")]))
    assert spec.deadline_unix_s is None
    assert spec.nodes[0] == NodeSpec(id="a")
    assert spec.nodes[0].sampling == SamplingSpec()


def test_empty_chat_is_kept_apart_from_no_prompt() -> None:
    msg = pb.NodeSpec(id="a")
    msg.chat.SetInParent()
    assert node_spec_from_proto(msg).messages == ()
    assert job_spec_to_proto(JobSpec(nodes=(NodeSpec("a", messages=()),))).nodes[0].HasField("chat")


def test_round_trip() -> None:
    spec = JobSpec(
        nodes=(
            make_node("a", sampling=SamplingSpec(top_p=0.5, top_k=40, temperature=0.0)),
            make_chat_node("b", ("system", "s"), ("user", "{{a.output}}"), depends_on=("a",)),
            NodeSpec(id="c"),
        ),
        inputs={"k": "v"},
        idempotency_key="key",
        priority=-2,
        deadline_unix_s=1_234_567_890.999,
        name="n",
    )
    assert job_spec_from_proto(job_spec_to_proto(spec)) == spec


def test_deadline_splits_into_seconds_and_nanos() -> None:
    spec = JobSpec(nodes=(make_node("a"),), deadline_unix_s=1_700_000_000.75)
    deadline = job_spec_to_proto(spec).deadline
    assert (deadline.seconds, deadline.nanos) == (1_700_000_000, 750_000_000)
    before_epoch = JobSpec(nodes=(make_node("a"),), deadline_unix_s=-1.25)
    deadline = job_spec_to_proto(before_epoch).deadline
    assert (deadline.seconds, deadline.nanos) == (-2, 750_000_000)
