"""The OpenTelemetry GenAI metrics, read back from an in-memory reader after a real run: one
record per call, token usage equal to the store's, durations that add up."""

from __future__ import annotations

import grpc
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.server import running_gateway
from gateway.settings import Settings
from tenants import MemoryQuotaStore, TenantQuota
from tests.gateway.conftest import ADMIN_KEY, sim_core

pytestmark = pytest.mark.anyio


def points(reader: InMemoryMetricReader) -> dict[str, list[HistogramDataPoint]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[HistogramDataPoint]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)  # type: ignore[arg-type]
    return found


async def test_each_call_records_the_genai_metrics_once() -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    store = MemoryQuotaStore()
    await store.create_tenant("acme", "Acme", TenantQuota())
    key = (await store.issue_key("acme"))[1]
    settings = Settings(port=0, admin_key=ADMIN_KEY)
    spec = pb.JobSpec(
        nodes=[
            pb.NodeSpec(
                id=f"n{i}", prompt_template=f"say {i}", sampling=pb.SamplingSpec(max_tokens=8)
            )
            for i in range(3)
        ]
    )
    async with (
        running_gateway(settings, core=sim_core(0.001), store=store, meter_provider=meters) as gw,
        grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as channel,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        auth = (("authorization", f"Bearer {key}"),)
        async for _ in stub.RunJob(pb.SubmitJobRequest(job=spec), metadata=auth):
            pass
        await gw.dispatcher.outbox.wait_drained()
        usage = await store.usage("acme")
    found = points(reader)
    tokens = {p.attributes["gen_ai.token.type"]: p for p in found["gen_ai.client.token.usage"]}
    assert (tokens["input"].count, tokens["output"].count) == (3, 3)
    assert (tokens["input"].sum, tokens["output"].sum) == (usage.input_tokens, usage.output_tokens)
    for name in (
        "gen_ai.client.operation.duration",
        "gen_ai.server.request.duration",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
    ):
        [point] = found[name]
        assert point.count == 3 and point.sum >= 0, name
        assert point.attributes["gen_ai.request.model"] == "SmolLM2-135M-Instruct"
        assert point.attributes["gen_ai.operation.name"] == "chat"
    meters.shutdown()
