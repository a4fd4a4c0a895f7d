"""Runtime job state as protobuf messages (the gateway's outward view)."""

from __future__ import annotations

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
from tenants.policies import kv_token_time

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
