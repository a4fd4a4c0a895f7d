"""The job and call spans: `invoke_workflow <job>` and `chat <model>`, GenAI attributes.

Attributes follow the OpenTelemetry GenAI semantic conventions (`gen_ai.*`, the development
conventions as of semantic-conventions v1.37) where they define one; ours are under `fairgate.*`.
A call span is INTERNAL (the model runs in this process); a call that ends FAILED or CANCELLED
sets `error.type` and the span's status to ERROR with the node's reason.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from engine import FinishReason, TokenDelta
from gateway.job_run import JobRun, NodeState
from gateway.telemetry import PROVIDER_NAME
from gateway.tickets import Ticket


def start_job_span(tracer: trace.Tracer, run: JobRun) -> trace.Span:
    return tracer.start_span(
        f"invoke_workflow {run.spec.name or run.job_id}",
        attributes={
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.provider.name": PROVIDER_NAME,
            "fairgate.job.id": run.job_id,
            "fairgate.tenant.id": run.tenant_id,
            "fairgate.job.nodes": len(run.nodes),
        },
    )


ERROR_TYPES = {  # a failed node's reason -> a low-cardinality error.type
    "engine error": "engine_error",
    "internal error": "internal_error",
    "call aborted by the engine": "aborted",
    "quota store unavailable": "store_unavailable",
}


def annotate_call(span: trace.Span, ticket: Ticket, last: TokenDelta | None, produced: int) -> None:
    params = ticket.plan.params
    node = ticket.run.nodes[ticket.call.node_id]
    if node.time_to_first_token is not None:
        span.set_attribute("gen_ai.response.time_to_first_chunk", node.time_to_first_token)
    if node.state in (NodeState.FAILED, NodeState.CANCELLED):
        kind = "cancelled" if node.state is NodeState.CANCELLED else "failed"
        span.set_attribute("error.type", ERROR_TYPES.get(node.reason, kind))
        span.set_status(Status(StatusCode.ERROR, node.reason))
    span.set_attributes(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER_NAME,
            "gen_ai.request.model": ticket.model_name,
            "gen_ai.response.model": ticket.model_name,
            "gen_ai.request.stream": True,  # the engine streams every call's tokens
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
            "fairgate.predicted_output_tokens": ticket.call.predicted_output,
        }
    )
