"""Tracing and metrics set-up: OpenTelemetry with GenAI semantic-convention attributes.

Spans: the gRPC server span (instrumentation interceptor) -> `invoke_workflow <job>` per job ->
`chat <model>` per call. OTLP export is on when the standard `OTEL_EXPORTER_OTLP_ENDPOINT`
(or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the exporter reads the other `OTEL_*`
variables itself. With nowhere to export there is no provider and no span work at all: no
interceptor and no spans, not even non-recording ones. The GenAI metrics go over OTLP the same
way (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`); Prometheus metrics:
gateway/metrics.py.
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

TRACER_NAME = "fairgate"
PROVIDER_NAME = "fairgate"  # gen_ai.provider.name


def setup_tracing(exporter: SpanExporter | None = None) -> TracerProvider | None:
    """A tracer provider exporting to `exporter`, or over OTLP when the env asks for it; None
    when there is nowhere to export to (the gateway then skips all span work)."""
    if exporter is None and (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    if exporter is None:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": "fairgate"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    return provider


def setup_metrics(reader: MetricReader | None = None) -> MeterProvider | None:
    """A meter provider reading into `reader`, or exporting over OTLP when the env asks for it;
    None when there is nowhere to export to (the GenAI metrics are then not recorded)."""
    if reader is None and (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    ):
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    if reader is None:
        return None
    resource = Resource.create({"service.name": "fairgate"})
    return MeterProvider(resource=resource, metric_readers=[reader])


def tracer(provider: TracerProvider) -> trace.Tracer:
    return provider.get_tracer(TRACER_NAME)
