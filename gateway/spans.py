"""The job and call spans: `invoke_workflow {name}` and `chat {model}`, with GenAI attributes.

Names, kinds and attributes follow the OpenTelemetry GenAI semantic conventions as released in
semantic-conventions v1.41.0 (development status; docs/OPERATIONS.md "Tracing"); ours are under
`fairgate.*`. The job span is INTERNAL and carries `gen_ai.workflow.name` (the job's name). A
call span is a child of its job's span, INTERNAL on the in-process engine and CLIENT on a remote
(`openai`) backend, whose URL gives `server.address` and `server.port`; what sampling may need
(operation, provider, model, server) is set when the span starts. Span events tell the call's way
through the gateway: queued (stamped when it became ready), prediction, capped (the anomaly
guard lowered its max_tokens), dispatched (which backend), refined (dispatch.py) and shed
(`add_shed_event`). A call or job that ends FAILED or CANCELLED sets `error.type` (a short
code, `ERROR_TYPES`) and the span's status to ERROR with the reason; so does an attempt lost with
its backend, whose node runs again under a new span.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from engine import FinishReason, TokenDelta
from gateway.backends import Backend, OpenAIBackend
from gateway.job_run import JobRun, JobState, NodeRun, NodeState
from gateway.telemetry import PROVIDER_NAME
from gateway.tickets import Ticket
from tenants.policies import JobInfo

ERROR_TYPES = {  # a failed node's reason (or its start) -> a low-cardinality error.type
    "engine error": "engine_error",
    "internal error": "internal_error",
    "call aborted by the engine": "aborted",
    "quota store unavailable": "store_unavailable",
    "backend lost": "backend_lost",
    "deadline exceeded": "deadline_exceeded",
    "parent ": "parent_failed",
    "the prompt ": "prompt_too_large",
    "prompt of ": "prompt_too_large",
}
DEFAULT_PORTS = {"http": 80, "https": 443}


def error_type(node: NodeRun) -> str:
    """The `error.type` of a node that failed or was cancelled: a short code, never free text."""
    for start, code in ERROR_TYPES.items():
        if node.reason.startswith(start):
            return code
    return "cancelled" if node.state is NodeState.CANCELLED else "failed"


@dataclass(frozen=True, slots=True)
class CallTarget:
    """Where a call runs, as its span tells it."""

    backend: str  # the backend's name in its pool
    kind: SpanKind  # INTERNAL: the engine in this process; CLIENT: a server over HTTP
    address: str | None = None  # server.address of a remote backend
    port: int | None = None  # server.port of a remote backend

    @property
    def backend_kind(self) -> str:
        return "local" if self.kind is SpanKind.INTERNAL else "openai"


def call_target(backend: Backend) -> CallTarget:
    if not isinstance(backend, OpenAIBackend):
        return CallTarget(backend.name, SpanKind.INTERNAL)
    parts = urlsplit(backend.settings.url or "")
    port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    return CallTarget(backend.name, SpanKind.CLIENT, parts.hostname, port)


def start_job_span(tracer: trace.Tracer, run: JobRun, info: JobInfo | None = None) -> trace.Span:
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.provider.name": PROVIDER_NAME,
        "fairgate.job.id": run.job_id,
        "fairgate.tenant.id": run.tenant_id,
        "fairgate.job.nodes": len(run.nodes),
        "fairgate.job.priority": run.spec.priority,
    }
    if run.spec.name:
        attributes["gen_ai.workflow.name"] = run.spec.name
    if info is not None:
        predicted = sum(node.predicted_output for node in info.nodes)
        attributes["fairgate.job.predicted_output_tokens"] = predicted
    name = f"invoke_workflow {run.spec.name}" if run.spec.name else "invoke_workflow"
    return tracer.start_span(name, attributes=attributes)


def end_job_span(span: trace.Span, run: JobRun) -> None:
    """End the job's span with its final state; a failed or cancelled job is an error, named
    after the node that failed first (not its descendants), and each failed node that never ran
    a call (no `chat` span of its own) is an event."""
    span.set_attribute("fairgate.job.state", run.state.value)
    for node_id, node in run.nodes.items():
        if node.state is NodeState.FAILED and node.started_at is None:
            span.add_event(
                "fairgate.node.failed",
                {
                    "fairgate.node.id": node_id,
                    "error.type": error_type(node),
                    "fairgate.node.reason": node.reason,
                },
            )
    if run.state in (JobState.FAILED, JobState.CANCELLED):
        failed = [
            (node_id, node)
            for node_id, node in run.nodes.items()
            if node.state in (NodeState.FAILED, NodeState.CANCELLED)
        ]
        first = min(failed, key=lambda n: _root_cause_key(n[1]), default=None)
        if first is None:
            span.set_attribute("error.type", run.state.value)
            span.set_status(Status(StatusCode.ERROR, run.state.value))
        else:
            span.set_attribute("error.type", error_type(first[1]))
            span.set_status(Status(StatusCode.ERROR, f"node {first[0]!r}: {first[1].reason}"))
    span.end()


def _root_cause_key(node: NodeRun) -> tuple[bool, float]:
    """Orders failed nodes: those that failed themselves before those failed by a parent, then
    by when they ended."""
    return (error_type(node) == "parent_failed", node.finished_at or float("inf"))


@contextlib.contextmanager
def call_span(
    tracer: trace.Tracer,
    job_span: trace.Span | None,
    ticket: Ticket,
    backend: Backend,
    priority: float = 0.0,
) -> Iterator[trace.Span]:
    """The call's `chat {model}` span under its job's span, current while the call streams;
    its start events say how the call got to its backend. `annotate_call` completes it."""
    target = call_target(backend)
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER_NAME,
        "gen_ai.request.model": ticket.model_name,
        "fairgate.backend.name": target.backend,
        "fairgate.backend.kind": target.backend_kind,
        "fairgate.call.attempt": ticket.attempt,
        "fairgate.queue.wait_s": ticket.run.nodes[ticket.call.node_id].queue_wait or 0.0,
    }
    if target.address is not None:
        attributes["server.address"] = target.address
    if target.port is not None:
        attributes["server.port"] = target.port
    parent = trace.set_span_in_context(job_span if job_span is not None else trace.INVALID_SPAN)
    name = f"chat {ticket.model_name}"
    with tracer.start_as_current_span(
        name, context=parent, kind=target.kind, attributes=attributes
    ) as span:
        _started(span, ticket, target, priority)
        yield span


def _started(span: trace.Span, ticket: Ticket, target: CallTarget, priority: float) -> None:
    node, plan = ticket.run.nodes[ticket.call.node_id], ticket.plan
    now_ns = time.time_ns()
    wait = node.queue_wait or 0.0
    span.add_event(  # stamped when the call became ready: the wait is the fair queue's
        "fairgate.queued",
        {"fairgate.queue.wait_s": wait},
        timestamp=now_ns - int(wait * 1e9),
    )
    predicted: dict[str, AttributeValue] = {
        "fairgate.predicted_output_tokens": plan.policy_output,
        "fairgate.reserved_output_tokens": plan.reserve_output,
        "fairgate.prediction.conservative": plan.conservative,
    }
    if plan.prediction is not None:
        predicted["fairgate.prediction.mean"] = plan.prediction.mean
        predicted["fairgate.prediction.p90"] = plan.prediction.p90
    span.add_event("fairgate.prediction", predicted, timestamp=now_ns)
    if plan.cap_reason:
        capped: dict[str, AttributeValue] = {
            "fairgate.cap.max_tokens": plan.params.max_tokens,
            "fairgate.cap.reason": plan.cap_reason,
        }
        span.add_event("fairgate.capped", capped, timestamp=now_ns)
    dispatched: dict[str, AttributeValue] = {
        "fairgate.backend.name": target.backend,
        "fairgate.backend.kind": target.backend_kind,
        "fairgate.call.priority": priority,
    }
    span.add_event("fairgate.dispatched", dispatched, timestamp=now_ns)


def add_shed_event(
    span: trace.Span, reason: str, *, action: str = "refused", retry_after_s: float | None = None
) -> None:
    """Record that the overload policy shed work on `span`: `reason` as the refusal says it
    (`ErrorInfo.reason`: OVERLOADED, SLO_SHED), `action` what was done (refused, held)."""
    attributes: dict[str, AttributeValue] = {
        "fairgate.shed.reason": reason,
        "fairgate.shed.action": action,
    }
    if retry_after_s is not None:
        attributes["fairgate.shed.retry_after_s"] = retry_after_s
    span.add_event("fairgate.shed", attributes)


def annotate_call(span: trace.Span, ticket: Ticket, last: TokenDelta | None, produced: int) -> None:
    """What the call did, once it ended (or was lost): usage, finish, error."""
    params = ticket.plan.params
    node = ticket.run.nodes[ticket.call.node_id]
    if node.time_to_first_token is not None:
        span.set_attribute("gen_ai.response.time_to_first_chunk", node.time_to_first_token)
    if node.state in (NodeState.FAILED, NodeState.CANCELLED):
        span.set_attribute("error.type", error_type(node))
        span.set_status(Status(StatusCode.ERROR, node.reason))
    elif node.state is NodeState.READY:  # lost with its backend: the node runs again
        span.set_attribute("error.type", ERROR_TYPES["backend lost"])
        span.set_status(Status(StatusCode.ERROR, "backend lost: running again"))
    span.set_attributes(
        {
            "gen_ai.response.model": ticket.model_name,  # a pool's backends serve one model
            "gen_ai.request.stream": True,  # every backend streams the call's tokens
            "gen_ai.request.max_tokens": params.max_tokens,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.response.id": ticket.call.call_id,
            "gen_ai.usage.input_tokens": ticket.call.prompt_tokens,
            "gen_ai.usage.output_tokens": produced,
            "gen_ai.response.finish_reasons": [
                (last.finish_reason or FinishReason.ABORT).value if last else "abort"
            ],
            "fairgate.tenant.id": ticket.call.tenant_id,
            "fairgate.job.id": ticket.call.job_id,
            "fairgate.node.id": ticket.call.node_id,
            "fairgate.node.state": node.state.value,
            "fairgate.predicted_output_tokens": ticket.call.predicted_output,
        }
    )
