"""Conversion between the fairgate.v1 job protos and the job model, field by field.

Proto3 presence maps to None: an unset `optional` sampling scalar, an unset prompt oneof and an
unset deadline all become None, so "not given" never turns into a zero. Invariant: for any spec
whose values fit the proto types (one prompt per node, deadlines to the nanosecond),
`job_spec_from_proto(job_spec_to_proto(spec)) == spec`.
"""

from __future__ import annotations

import math

from fairgate.v1 import gateway_pb2 as pb
from gateway.jobs.model import ChatMessage, JobSpec, NodeSpec, SamplingSpec

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


def node_from_proto(msg: pb.NodeSpec) -> NodeSpec:
    prompt_kind = msg.WhichOneof("prompt")
    return NodeSpec(
        id=msg.id,
        prompt_template=msg.prompt_template if prompt_kind == "prompt_template" else None,
        messages=chat_from_proto(msg.chat) if prompt_kind == "chat" else None,
        depends_on=tuple(msg.depends_on),
        sampling=sampling_from_proto(msg.sampling),
        name=msg.name,
    )


def job_spec_from_proto(msg: pb.JobSpec) -> JobSpec:
    deadline = None
    if msg.HasField("deadline"):
        deadline = msg.deadline.seconds + msg.deadline.nanos / _NANOS_PER_SECOND
    return JobSpec(
        nodes=tuple(node_from_proto(node) for node in msg.nodes),
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


def node_to_proto(node: NodeSpec) -> pb.NodeSpec:
    msg = pb.NodeSpec(
        id=node.id,
        depends_on=node.depends_on,
        sampling=sampling_to_proto(node.sampling),
        name=node.name,
    )
    if node.prompt_template is not None:
        msg.prompt_template = node.prompt_template
    elif node.messages is not None:
        msg.chat.CopyFrom(chat_to_proto(node.messages))
    return msg


def job_spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    msg = pb.JobSpec(
        nodes=[node_to_proto(node) for node in spec.nodes],
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
