"""Tracing is configured by the standard OTEL_* variables, or not at all."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.telemetry import setup_tracing, tracer

ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


@pytest.mark.parametrize("variable", ENDPOINTS)
def test_an_otlp_endpoint_turns_tracing_on(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENDPOINTS:
        monkeypatch.delenv(name, raising=False)
    assert setup_tracing() is None
    monkeypatch.setenv(variable, "http://127.0.0.1:4317")
    provider = setup_tracing()
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "fairgate"
    provider.shutdown()


def test_an_explicit_exporter_receives_the_spans() -> None:
    exporter = InMemorySpanExporter()
    provider = setup_tracing(exporter)
    assert provider is not None
    with tracer(provider).start_as_current_span("probe"):
        pass
    provider.force_flush()
    assert [s.name for s in exporter.get_finished_spans()] == ["probe"]
    provider.shutdown()
