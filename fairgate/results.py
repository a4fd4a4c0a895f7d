"""What the Gateway returns, as plain typed objects: jobs, nodes, events and Generate chunks.

Each `*_from_proto` maps one fairgate.v1 message field by field. Timestamps become aware UTC
datetimes, unset ones None; enums become `JobState`, `NodeState` and `FinishReason` members
(an unknown value from a newer server reads as UNSPECIFIED, an unknown event kind as None).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from fairgate.v1 import gateway_pb2 as pb


class JobState(enum.Enum):
    UNSPECIFIED = pb.JOB_STATE_UNSPECIFIED
    QUEUED = pb.JOB_STATE_QUEUED
    RUNNING = pb.JOB_STATE_RUNNING
    SUCCEEDED = pb.JOB_STATE_SUCCEEDED
    FAILED = pb.JOB_STATE_FAILED
    CANCELLED = pb.JOB_STATE_CANCELLED

    @property
    def ended(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class NodeState(enum.Enum):
    UNSPECIFIED = pb.NODE_STATE_UNSPECIFIED
    PENDING = pb.NODE_STATE_PENDING
    READY = pb.NODE_STATE_READY
    RUNNING = pb.NODE_STATE_RUNNING
    SUCCEEDED = pb.NODE_STATE_SUCCEEDED
    FAILED = pb.NODE_STATE_FAILED
    CANCELLED = pb.NODE_STATE_CANCELLED
    CAPPED = pb.NODE_STATE_CAPPED


class FinishReason(enum.Enum):
    UNSPECIFIED = pb.FINISH_REASON_UNSPECIFIED
    STOP = pb.FINISH_REASON_STOP
    LENGTH = pb.FINISH_REASON_LENGTH
    CAPPED = pb.FINISH_REASON_CAPPED
    CANCELLED = pb.FINISH_REASON_CANCELLED
    ERROR = pb.FINISH_REASON_ERROR


@dataclass(frozen=True, slots=True)
class TokenUsage:
    prompt_tokens: int
    output_tokens: int
    kv_token_steps: int  # KV token-time: p*d + d*(d+1)/2 summed over calls


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    name: str
    state: NodeState
    # complete once SUCCEEDED or CAPPED (in the NodeStateChanged that says so too: a watcher
    # whose deltas were dropped has it there); empty in NodeStateChanged events of other states
    output: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: FinishReason
    reason: str  # why it failed, was cancelled or capped
    ready_time: datetime | None
    start_time: datetime | None
    first_token_time: datetime | None
    finish_time: datetime | None


@dataclass(frozen=True, slots=True)
class Job:
    job_id: str
    tenant_id: str
    name: str
    state: JobState
    reason: str
    nodes: tuple[Node, ...]  # in JobSpec order
    usage: TokenUsage
    create_time: datetime | None
    start_time: datetime | None
    finish_time: datetime | None

    @property
    def outputs(self) -> dict[str, str]:
        """Node id -> output text, in JobSpec order."""
        return {node.id: node.output for node in self.nodes}

    def node(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)


@dataclass(frozen=True, slots=True)
class NodeStateChanged:
    sequence: int  # 1, 2, 3, ... per job; resume a watch from the last seen + 1
    job_id: str
    time: datetime | None
    node: Node  # the node after the change
    previous_state: NodeState


@dataclass(frozen=True, slots=True)
class TokenDelta:
    sequence: int
    job_id: str
    time: datetime | None
    node_id: str
    text: str
    token_count: int


@dataclass(frozen=True, slots=True)
class JobFinished:
    sequence: int
    job_id: str
    time: datetime | None
    job: Job  # the final job: SUCCEEDED, FAILED or CANCELLED


JobEvent = NodeStateChanged | TokenDelta | JobFinished


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Generated text from Generate, as it arrives. `restarted`: the call runs again from its
    prompt (its backend was lost, or it gave its slot to another call): the text before this
    delta is void, and this delta's text starts it over."""

    text: str
    token_ids: tuple[int, ...]
    restarted: bool = False


@dataclass(frozen=True, slots=True)
class GenerateFinished:
    """The last item of Generate: the whole text and why generation stopped."""

    text: str
    finish_reason: FinishReason
    usage: TokenUsage
    reason: str = ""  # why a call that failed, was cancelled or was capped ended so


def datetime_from_proto(parent: Message, field: str) -> datetime | None:
    if not parent.HasField(field):
        return None
    stamp: Timestamp = getattr(parent, field)
    return stamp.ToDatetime(tzinfo=UTC)


E = TypeVar("E", JobState, NodeState, FinishReason)


def enum_from_proto(kind: type[E], value: int) -> E:
    try:
        return kind(value)
    except ValueError:
        return kind(0)


def usage_from_proto(msg: pb.TokenUsage) -> TokenUsage:
    return TokenUsage(msg.prompt_tokens, msg.output_tokens, msg.kv_token_steps)


def node_from_proto(msg: pb.Node) -> Node:
    return Node(
        id=msg.id,
        name=msg.name,
        state=enum_from_proto(NodeState, msg.state),
        output=msg.output,
        prompt_tokens=msg.prompt_tokens,
        output_tokens=msg.output_tokens,
        finish_reason=enum_from_proto(FinishReason, msg.finish_reason),
        reason=msg.reason,
        ready_time=datetime_from_proto(msg, "ready_time"),
        start_time=datetime_from_proto(msg, "start_time"),
        first_token_time=datetime_from_proto(msg, "first_token_time"),
        finish_time=datetime_from_proto(msg, "finish_time"),
    )


def job_from_proto(msg: pb.Job) -> Job:
    return Job(
        job_id=msg.job_id,
        tenant_id=msg.tenant_id,
        name=msg.name,
        state=enum_from_proto(JobState, msg.state),
        reason=msg.reason,
        nodes=tuple(node_from_proto(node) for node in msg.nodes),
        usage=usage_from_proto(msg.usage),
        create_time=datetime_from_proto(msg, "create_time"),
        start_time=datetime_from_proto(msg, "start_time"),
        finish_time=datetime_from_proto(msg, "finish_time"),
    )


def event_from_proto(msg: pb.JobEvent) -> JobEvent | None:
    """The event, or None for a kind of event this client does not know (a newer server)."""
    time = datetime_from_proto(msg, "time")
    kind = msg.WhichOneof("event")
    if kind == "node_state_changed":
        change = msg.node_state_changed
        node = node_from_proto(change.node)
        previous = enum_from_proto(NodeState, change.previous_state)
        return NodeStateChanged(msg.sequence, msg.job_id, time, node, previous)
    if kind == "token_delta":
        delta = msg.token_delta
        return TokenDelta(
            msg.sequence, msg.job_id, time, delta.node_id, delta.text, delta.token_count
        )
    if kind == "job_finished":
        return JobFinished(msg.sequence, msg.job_id, time, job_from_proto(msg.job_finished.job))
    return None
