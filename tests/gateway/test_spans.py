"""The job and call spans (gateway/spans.py): kinds, server attributes, error codes, events.

The last test runs a gateway before a `fairgate engine serve` process (the `openai` backend) and
checks that its calls' spans are CLIENT spans naming the server's address and port.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from engine import FinishReason, SamplingParams, TokenDelta
from fairgate.v1 import gateway_pb2 as pb
from gateway.backends import Backend, BackendSettings, OpenAIBackend
from gateway.calls import CallPlan
from gateway.job_run import JobRun, NodeState
from gateway.jobs.model import JobSpec, NodeSpec
from gateway.spans import (
    add_shed_event,
    annotate_call,
    call_span,
    call_target,
    end_job_span,
    error_type,
    start_job_span,
)
from gateway.tickets import Ticket
from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from tenants.policies import ReadyCall
from tests.gateway.conftest import Spans, sim_core
from tests.gateway.engine_servers import MODEL, backend_of, engine_servers
from tests.reliability.harness import node, reliable_gateway, roots


@pytest.fixture
def memory() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def make_run(*nodes: tuple[str, tuple[str, ...]], name: str = "") -> JobRun:
    specs = tuple(NodeSpec(id=n, prompt_template="go", depends_on=deps) for n, deps in nodes)
    return JobRun("job-1", "alpha", JobSpec(nodes=specs, name=name), created_at=0.0)


def remote(url: str, tmp_path: Path) -> OpenAIBackend:
    """An openai backend, never entered: nothing is sent to `url`."""
    table = {"kind": "openai", "url": url, "model": "m", "tokenizer": tmp_path}
    return OpenAIBackend(BackendSettings.model_validate(table), tokenizer=None)


class LocalLike:
    """Any backend but an `openai` one runs in this process, as far as spans go."""

    name = "local"


def make_ticket(run: JobRun, node_id: str, cap_reason: str = "") -> Ticket:
    params = SamplingParams(max_tokens=16)
    features = CallFeatures(run.tenant_id, node_id, 5, 16, "go", "m")
    plan = CallPlan(params, features, 7.0, 9, cap_reason, LengthDistribution(7, 6, 9, 12))
    call = ReadyCall(f"{run.job_id}/{node_id}", run.job_id, run.tenant_id, node_id, 5, 7.0, 16)
    return Ticket(call, run, array("i", [1, 2, 3, 4, 5]), plan, "m")


def test_an_attempt_lost_with_its_backend_is_an_error_of_its_own(
    memory: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = memory
    run = make_run(("a", ()))
    run.start(0.0)
    ticket = make_ticket(run, "a", cap_reason="capped at 16 tokens: endless_output")
    run.mark_running("a", 5, 0.25)
    backend: Backend = LocalLike()  # type: ignore[assignment]
    with call_span(provider.get_tracer("t"), None, ticket, backend, priority=3.0) as span:
        run.add_tokens("a", "hi", (7,), 0.5)
        run.retry_node("a", 1.0, "backend lost: running again")
        ticket.attempt += 1  # as the lost-call rule does, before the span is annotated
        last = TokenDelta("a", [7], "hi", False, None)
        annotate_call(span, ticket, last, 1)
    [chat] = exporter.get_finished_spans()
    attrs = chat.attributes or {}
    assert chat.name == "chat m" and chat.kind is SpanKind.INTERNAL
    assert attrs["fairgate.call.attempt"] == 1  # the attempt the span is for
    assert attrs["fairgate.queue.wait_s"] == 0.25
    assert attrs["error.type"] == "backend_lost"
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.status.description == "backend lost: running again"
    names = [e.name for e in chat.events]
    assert names == [
        "fairgate.queued",
        "fairgate.prediction",
        "fairgate.capped",
        "fairgate.dispatched",
    ]
    queued, predicted, capped, dispatched = (dict(e.attributes or {}) for e in chat.events)
    assert queued == {"fairgate.queue.wait_s": 0.25}
    assert chat.events[0].timestamp < chat.events[1].timestamp  # stamped when it was ready
    assert (
        predicted["fairgate.prediction.p90"] == 9
        and predicted["fairgate.reserved_output_tokens"] == 9
    )
    assert capped == {
        "fairgate.cap.max_tokens": 16,
        "fairgate.cap.reason": "capped at 16 tokens: endless_output",
    }
    assert dispatched["fairgate.call.priority"] == 3.0


def test_a_finished_call_has_no_error(
    memory: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = memory
    run = make_run(("a", ()))
    run.start(0.0)
    ticket = make_ticket(run, "a")
    run.mark_running("a", 5, 0.0)
    backend: Backend = LocalLike()  # type: ignore[assignment]
    with call_span(provider.get_tracer("t"), None, ticket, backend) as span:
        run.add_tokens("a", "hi", (7,), 0.5)
        run.finish_node("a", NodeState.SUCCEEDED, 1.0)
        annotate_call(span, ticket, TokenDelta("a", [8], "!", True, FinishReason.LENGTH), 2)
    [chat] = exporter.get_finished_spans()
    attrs = chat.attributes or {}
    assert "error.type" not in attrs and chat.status.status_code is StatusCode.UNSET
    assert attrs["gen_ai.response.time_to_first_chunk"] == 0.5
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert attrs["fairgate.node.state"] == "succeeded"
    assert "fairgate.capped" not in [e.name for e in chat.events]


@pytest.mark.parametrize(
    ("url", "address", "port"),
    [
        ("http://engine.test:8000", "engine.test", 8000),
        ("https://engine.test", "engine.test", 443),
        ("http://[::1]:9000", "::1", 9000),
    ],
)
def test_a_remote_backend_is_a_client_call_to_its_server(
    url: str, address: str, port: int, tmp_path: Path
) -> None:
    target = call_target(remote(url, tmp_path))
    assert (target.kind, target.address, target.port) == (SpanKind.CLIENT, address, port)
    assert target.backend_kind == "openai"


@pytest.mark.parametrize(
    ("state", "reason", "code"),
    [
        (NodeState.FAILED, "engine error", "engine_error"),
        (NodeState.FAILED, "backend lost", "backend_lost"),
        (NodeState.FAILED, "parent 'a' failed", "parent_failed"),
        (NodeState.FAILED, "prompt of 90 tokens exceeds the limit of 64", "prompt_too_large"),
        (NodeState.FAILED, "deadline exceeded", "deadline_exceeded"),
        (NodeState.FAILED, "tenant acme is over its tokens per minute", "failed"),
        (NodeState.CANCELLED, "cancelled by the client", "cancelled"),
        (NodeState.CANCELLED, "deadline exceeded", "deadline_exceeded"),
    ],
)
def test_error_type_is_a_short_code_never_the_reason(
    state: NodeState, reason: str, code: str
) -> None:
    run = make_run(("a", ()))
    run.nodes["a"].state, run.nodes["a"].reason = state, reason
    assert error_type(run.nodes["a"]) == code


def test_a_shed_event_says_why_and_what_was_done(
    memory: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = memory
    with provider.get_tracer("t").start_as_current_span("job") as span:
        add_shed_event(span, "SLO_SHED", action="held", retry_after_s=2.5)
        add_shed_event(span, "OVERLOADED")
    [finished] = exporter.get_finished_spans()
    held, refused = finished.events
    assert held.name == refused.name == "fairgate.shed"
    assert dict(held.attributes or {}) == {
        "fairgate.shed.reason": "SLO_SHED",
        "fairgate.shed.action": "held",
        "fairgate.shed.retry_after_s": 2.5,
    }
    assert dict(refused.attributes or {}) == {
        "fairgate.shed.reason": "OVERLOADED",
        "fairgate.shed.action": "refused",
    }


@pytest.mark.anyio
async def test_a_job_refused_at_max_active_jobs_has_a_shed_event(spans: Spans) -> None:
    """docs/OPERATIONS.md: a refusal OVERLOADED puts `fairgate.shed` on the refused RPC's span,
    as SLO_SHED does; one for the gateway holding `max_active_jobs` jobs had none."""
    async with reliable_gateway(
        core=sim_core(0.01), tracer_provider=spans.provider, max_active_jobs=1
    ) as h:
        await h.tenant("a")
        await h.submit("a", roots(1, 400))  # still running when the next comes
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.submit("a", roots(1, 8))
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    submits = [s for s in spans.finished() if s.name.endswith("SubmitJob")]
    assert len(submits) == 2
    [shed] = [event for span in submits for event in span.events if event.name == "fairgate.shed"]
    assert dict(shed.attributes or {}) == {
        "fairgate.shed.reason": "OVERLOADED",
        "fairgate.shed.action": "refused",
        "fairgate.shed.retry_after_s": 1.0,
    }


def test_a_failed_job_span_names_the_node_that_failed_first(
    memory: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = memory
    run = make_run(("a", ()), ("b", ("a",)), ("x", ()), name="pipeline")
    span = start_job_span(provider.get_tracer("t"), run)
    run.start(0.0)
    run.mark_running("a", 3, 0.5)
    run.finish_node("a", NodeState.FAILED, 1.0, "engine error")  # b fails with it, unrun
    run.finish_node("x", NodeState.SUCCEEDED, 2.0)
    end_job_span(span, run)
    [job] = exporter.get_finished_spans()
    attrs = job.attributes or {}
    assert job.name == "invoke_workflow pipeline" and job.kind is SpanKind.INTERNAL
    assert attrs["gen_ai.workflow.name"] == "pipeline"
    assert attrs["error.type"] == "engine_error" and attrs["fairgate.job.state"] == "failed"
    assert job.status.status_code is StatusCode.ERROR
    assert job.status.description == "node 'a': engine error"
    [unrun] = job.events
    assert unrun.name == "fairgate.node.failed"
    assert (unrun.attributes or {})["fairgate.node.id"] == "b"


def test_a_job_without_a_name_has_no_workflow_name(
    memory: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = memory
    run = make_run(("a", ()))
    span = start_job_span(provider.get_tracer("t"), run)
    run.start(0.0)
    run.finish_node("a", NodeState.SUCCEEDED, 1.0)
    end_job_span(span, run)
    [job] = exporter.get_finished_spans()
    assert job.name == "invoke_workflow"
    assert "gen_ai.workflow.name" not in (job.attributes or {})
    assert job.status.status_code is StatusCode.UNSET


@pytest.mark.anyio
async def test_calls_on_a_remote_server_are_client_spans_naming_it(
    spans: Spans, tmp_path: Path
) -> None:
    async with (
        engine_servers(tmp_path, 1, step_s=0.002) as servers,
        reliable_gateway(
            backends=[backend_of(s, tmp_path) for s in servers], tracer_provider=spans.provider
        ) as h,
    ):
        await h.tenant("a")
        spec = pb.JobSpec(
            nodes=[node("draft", "write", 6), node("review", "{{draft.output}}", 4, "draft")]
        )
        job = await h.run("a", spec)
        assert job.state == pb.JOB_STATE_SUCCEEDED
    port = int(servers[0].url.rsplit(":", 1)[1])
    chats = [s for s in spans.finished() if s.name.startswith("chat ")]
    assert len(chats) == 2
    for chat in chats:
        attrs = chat.attributes or {}
        assert chat.name == f"chat {MODEL}" and chat.kind is SpanKind.CLIENT
        assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", port)
        assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == MODEL
        assert attrs["fairgate.backend.kind"] == "openai"
        assert attrs["fairgate.backend.name"] == servers[0].name
        assert attrs["gen_ai.request.stream"] is True
        assert attrs["gen_ai.response.time_to_first_chunk"] >= 0  # type: ignore[operator]
        assert chat.status.status_code is StatusCode.UNSET
