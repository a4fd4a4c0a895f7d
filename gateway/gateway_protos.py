"""The fairgate.v1.Gateway service's messages, field by field: a `JobSpec` in, a job's runtime
state out.

In: proto3 presence maps to None: an unset `optional` sampling scalar, an unset prompt oneof and
an unset deadline all become None, so "not given" never turns into a zero. Out: a `JobRun` (and
its events) becomes `Job`, `Node`, `JobEvent` and `TokenUsage` messages; a node's finish reason
is the engine's for a success and its state otherwise. Invariant: for any spec whose values fit
the proto types (one prompt per node, deadlines to the nanosecond),
`job_spec_from_proto(job_spec_to_proto(spec)) == spec`.
"""

from __future__ import annotations

import math

from google.protobuf.timestamp_pb2 import Timestamp

from fairgate.v1 import gateway_pb2 as pb
from gateway.job_run import (
    JobEnded,
    JobEvent,
    JobRun,
    JobState,
    NodeChanged,
    NodeRun,
    NodeState,
    TokensAdded,
)
from gateway.jobs import JobCounts, NodeCounts
from gateway.jobs.model import ChatMessage, JobSpec, NodeSpec, SamplingSpec
from tenants.policies import kv_token_time

_NANOS_PER_SECOND = 1_000_000_000


def sampling_from_proto(msg: pb.SamplingSpec) -> SamplingSpec:
    return SamplingSpec(
        max_tokens=msg.max_tokens if msg.HasField("max_tokens") else None,
        temperature=msg.temperature if msg.HasField("temperature") else None,
        top_p=msg.top_p if msg.HasField("top_p") else None,
        top_k=msg.top_k if msg.HasField("top_k") else None,
        stop=tuple(msg.stop),
        seed=msg.seed if msg.HasField("seed") else None,
    )


def chat_from_proto(msg: pb.ChatPrompt) -> tuple[ChatMessage, ...]:
    return tuple(ChatMessage(role=m.role, content=m.content) for m in msg.messages)


def node_spec_from_proto(msg: pb.NodeSpec) -> NodeSpec:
    prompt_kind = msg.WhichOneof("prompt")
    return NodeSpec(
        id=msg.id,
        prompt_template=msg.prompt_template if prompt_kind == "prompt_template" else None,
        messages=chat_from_proto(msg.chat) if prompt_kind == "chat" else None,
        depends_on=tuple(msg.depends_on),
        sampling=sampling_from_proto(msg.sampling),
        name=msg.name,
        model=msg.model,
    )


def job_counts(msg: pb.JobSpec) -> JobCounts:
    """The request's counts, read before anything is converted (`JobCounts`)."""
    nodes = [
        NodeCounts(len(node.chat.messages), len(node.sampling.stop), len(node.depends_on))
        for node in msg.nodes
    ]
    return JobCounts(nodes, len(msg.inputs))


def generate_counts(msg: pb.GenerateRequest) -> JobCounts:
    """A Generate request's counts, read before anything is converted: its one node's
    messages (or prompt) become inputs one for one, each placed by a template of the
    gateway's own (`_single_call`), so the messages are the count to check."""
    messages = len(msg.chat.messages) if msg.WhichOneof("input") == "chat" else 0
    return JobCounts([NodeCounts(messages, len(msg.sampling.stop), 0)], 1)


def job_templates(msg: pb.JobSpec) -> list[str]:
    """The request's templates as written (`check_templates`; its counts checked first)."""
    return [t for node in msg.nodes for t in _templates(node)]


def _templates(msg: pb.NodeSpec) -> list[str]:
    if msg.WhichOneof("prompt") == "prompt_template":
        return [msg.prompt_template]
    return [m.content for m in msg.chat.messages]


def job_spec_from_proto(msg: pb.JobSpec) -> JobSpec:
    deadline = None
    if msg.HasField("deadline"):
        deadline = msg.deadline.seconds + msg.deadline.nanos / _NANOS_PER_SECOND
    return JobSpec(
        nodes=tuple(node_spec_from_proto(node) for node in msg.nodes),
        inputs=dict(msg.inputs),
        idempotency_key=msg.idempotency_key,
        priority=msg.priority,
        deadline_unix_s=deadline,
        name=msg.name,
    )


def sampling_to_proto(spec: SamplingSpec) -> pb.SamplingSpec:
    # Passing None to a proto constructor leaves the field unset, which is the presence we want.
    return pb.SamplingSpec(
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        stop=spec.stop,
        seed=spec.seed,
    )


def chat_to_proto(messages: tuple[ChatMessage, ...]) -> pb.ChatPrompt:
    return pb.ChatPrompt(
        messages=[pb.ChatMessage(role=m.role, content=m.content) for m in messages]
    )


def node_spec_to_proto(node: NodeSpec) -> pb.NodeSpec:
    msg = pb.NodeSpec(
        id=node.id,
        depends_on=node.depends_on,
        sampling=sampling_to_proto(node.sampling),
        name=node.name,
        model=node.model,
    )
    if node.prompt_template is not None:
        msg.prompt_template = node.prompt_template
    elif node.messages is not None:
        msg.chat.CopyFrom(chat_to_proto(node.messages))
    return msg


def job_spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    msg = pb.JobSpec(
        nodes=[node_spec_to_proto(node) for node in spec.nodes],
        inputs=dict(spec.inputs),
        idempotency_key=spec.idempotency_key,
        priority=spec.priority,
        name=spec.name,
    )
    if spec.deadline_unix_s is not None:
        # Split before scaling: whole epoch nanoseconds exceed a float's exact range.
        seconds = math.floor(spec.deadline_unix_s)
        nanos = round((spec.deadline_unix_s - seconds) * _NANOS_PER_SECOND)
        carry, nanos = divmod(nanos, _NANOS_PER_SECOND)
        msg.deadline.seconds, msg.deadline.nanos = seconds + carry, nanos
    return msg


# --- a job's runtime state, outward ------------------------------------------------------

JOB_STATES = {
    JobState.QUEUED: pb.JOB_STATE_QUEUED,
    JobState.RUNNING: pb.JOB_STATE_RUNNING,
    JobState.SUCCEEDED: pb.JOB_STATE_SUCCEEDED,
    JobState.FAILED: pb.JOB_STATE_FAILED,
    JobState.CANCELLED: pb.JOB_STATE_CANCELLED,
}
NODE_STATES = {
    NodeState.PENDING: pb.NODE_STATE_PENDING,
    NodeState.READY: pb.NODE_STATE_READY,
    NodeState.RUNNING: pb.NODE_STATE_RUNNING,
    NodeState.SUCCEEDED: pb.NODE_STATE_SUCCEEDED,
    NodeState.FAILED: pb.NODE_STATE_FAILED,
    NodeState.CANCELLED: pb.NODE_STATE_CANCELLED,
    NodeState.CAPPED: pb.NODE_STATE_CAPPED,
}
ENDED_REASONS = {
    NodeState.CAPPED: pb.FINISH_REASON_CAPPED,
    NodeState.CANCELLED: pb.FINISH_REASON_CANCELLED,
    NodeState.FAILED: pb.FINISH_REASON_ERROR,
}


def finish_reason(node: NodeRun) -> pb.FinishReason.ValueType:
    """Why a node's generation ended: the engine's reason for a success, else its state."""
    if node.state is NodeState.SUCCEEDED:
        return pb.FINISH_REASON_LENGTH if node.hit_length else pb.FINISH_REASON_STOP
    return ENDED_REASONS.get(node.state, pb.FINISH_REASON_UNSPECIFIED)


def timestamp(seconds: float | None) -> Timestamp | None:
    if seconds is None:
        return None
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def node_to_proto(node: NodeRun) -> pb.Node:
    return pb.Node(
        id=node.spec.id,
        name=node.spec.name,
        state=NODE_STATES[node.state],
        output=node.output,
        prompt_tokens=node.prompt_tokens,
        output_tokens=node.output_tokens,
        finish_reason=finish_reason(node),
        reason=node.reason,
        ready_time=timestamp(node.ready_at),
        start_time=timestamp(node.started_at),
        first_token_time=timestamp(node.first_token_at),
        finish_time=timestamp(node.finished_at),
    )


def usage(nodes: list[NodeRun]) -> pb.TokenUsage:
    return pb.TokenUsage(
        prompt_tokens=sum(n.prompt_tokens for n in nodes),
        output_tokens=sum(n.output_tokens for n in nodes),
        kv_token_steps=int(sum(kv_token_time(n.prompt_tokens, n.output_tokens) for n in nodes)),
    )


def job_to_proto(run: JobRun) -> pb.Job:
    nodes = list(run.nodes.values())
    reasons = [f"{n.spec.id}: {n.reason}" for n in nodes if n.state is NodeState.FAILED]
    return pb.Job(
        job_id=run.job_id,
        tenant_id=run.tenant_id,
        name=run.spec.name,
        state=JOB_STATES[run.state],
        reason="; ".join(reasons[:3]),
        nodes=[node_to_proto(n) for n in nodes],
        usage=usage(nodes),
        create_time=timestamp(run.created_at),
        start_time=timestamp(run.started_at),
        finish_time=timestamp(run.finished_at),
    )


def event_to_proto(run: JobRun, event: JobEvent) -> pb.JobEvent:
    message = pb.JobEvent(sequence=event.sequence, job_id=run.job_id, time=timestamp(event.time))
    body = event.body
    if isinstance(body, NodeChanged):
        node = run.nodes[body.node_id]
        view = pb.Node(
            id=node.spec.id, name=node.spec.name, state=NODE_STATES[body.state], reason=body.reason
        )
        if body.state in (NodeState.SUCCEEDED, NodeState.CAPPED):  # its output is complete
            view.output, view.output_tokens = node.output, node.output_tokens
        message.node_state_changed.CopyFrom(
            pb.NodeStateChanged(node=view, previous_state=NODE_STATES[body.previous])
        )
    elif isinstance(body, TokensAdded):
        message.token_delta.CopyFrom(
            pb.TokenDelta(node_id=body.node_id, text=body.text, token_count=len(body.token_ids))
        )
    else:
        assert isinstance(body, JobEnded)
        message.job_finished.CopyFrom(pb.JobFinished(job=job_to_proto(run)))
    return message
