"""The job and call spans: `invoke_workflow <job>` and `chat <model>`, GenAI attributes.

Attributes follow the OpenTelemetry GenAI semantic conventions (`gen_ai.*`) where they define
one; ours are under `fairgate.*`.
"""

from __future__ import annotations

from opentelemetry import trace

from engine import FinishReason, TokenDelta
from gateway.job_run import JobRun
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


def annotate_call(span: trace.Span, ticket: Ticket, last: TokenDelta | None, produced: int) -> None:
    params = ticket.plan.params
    span.set_attributes(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER_NAME,
            "gen_ai.request.model": ticket.model_name,
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
