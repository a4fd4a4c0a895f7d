"""Prometheus /metrics on its own port, scraped during and after a multi-tenant run, against
what the jobs and the quota store say: tokens equal the settled usage, histograms count each
call once, jobs and calls by final state."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from fairgate.v1 import admin_pb2
from fairgate.v1 import gateway_pb2 as pb
from gateway.metrics import OTHER, GatewayMetrics
from gateway.server import serving_metrics
from tests.gateway.conftest import sim_core
from tests.reliability.harness import node, reliable_gateway, roots

pytestmark = pytest.mark.anyio
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(http: httpx.AsyncClient, url: str) -> Samples:
    reply = await http.get(url)
    assert reply.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_count_what_the_jobs_did() -> None:
    async with reliable_gateway(core=sim_core(0.002), metrics_port=0) as h:
        for tenant in ("a", "b", "c"):
            await h.tenant(tenant)
        url = f"http://127.0.0.1:{h.gateway.metrics_port}/metrics"
        async with httpx.AsyncClient() as http:
            running = await h.submit("a", roots(3, 100))
            during = await scrape(http, url)
            assert value(during, "fairgate_active_jobs", tenant="a") == 1
            assert value(during, "fairgate_backend_healthy", backend="local") == 1
            chain = pb.JobSpec(nodes=[node("x", "go", 20), node("y", "{{x.output}}", 20, "x")])
            for tenant, spec in (("a", chain), ("b", roots(2, 30)), ("b", chain)):
                await h.run(tenant, spec)
            await h.finished("a", running.job_id)
            # c cancels a call it has read tokens of: settled for those, in the metrics too
            cut = await h.submit("c", roots(1, 500))
            watch = pb.WatchJobRequest(job_id=cut.job_id)
            async for event in h.stub.WatchJob(watch, metadata=h.auth("c")):
                if event.WhichOneof("event") == "token_delta":
                    break
            cancel = pb.CancelJobRequest(job_id=cut.job_id)
            await h.stub.CancelJob(cancel, metadata=h.auth("c"))
            await h.unharmed()
            after = await scrape(http, url)
        for tenant in ("a", "b", "c"):
            usage = await h.usage(tenant)
            assert value(after, "fairgate_input_tokens_total", tenant=tenant) == usage.input_tokens
            assert value(after, "fairgate_output_tokens_total", tenant=tenant) == (
                usage.output_tokens
            )
        assert (await h.usage("c")).output_tokens > 0
        for tenant, jobs in (("a", 2), ("b", 2)):
            usage = await h.usage(tenant)
            calls = value(after, "fairgate_calls_total", tenant=tenant, state="succeeded")
            assert calls == usage.settled_calls
            ttft = value(after, "fairgate_time_to_first_token_seconds_count", tenant=tenant)
            assert ttft == calls  # once per call
            assert value(after, "fairgate_jobs_total", tenant=tenant, state="succeeded") == jobs
            assert value(after, "fairgate_active_jobs", tenant=tenant) == 0
        assert value(after, "fairgate_ready_calls") == 0


async def test_a_deleted_tenants_series_go_and_free_its_label() -> None:
    """Its label stayed for good: once `metrics_max_tenants` tenants had been seen, every new
    tenant was counted as `other`, and the deleted ones' series stayed on."""
    async with (
        reliable_gateway(metrics_port=0, metrics_max_tenants=2) as h,
        httpx.AsyncClient() as http,
    ):
        url = f"http://127.0.0.1:{h.gateway.metrics_port}/metrics"
        for old in ("old1", "old2"):
            await h.tenant(old)
            await h.run(old, roots(1))
            delete = admin_pb2.DeleteTenantRequest(tenant_id=old)
            await h.admin.DeleteTenant(delete, metadata=h.admin_auth)
        await h.tenant("fresh")
        await h.run("fresh", roots(1))
        samples = await scrape(http, url)
    jobs = "fairgate_jobs_total"
    assert value(samples, jobs, tenant="fresh", state="succeeded") == 1
    assert not {labels for name, labels in samples if name == jobs} - {
        (("state", "succeeded"), ("tenant", "fresh"))
    }


async def test_metrics_serve_on_a_bracketed_ipv6_host() -> None:
    """`[::1]`, the form the gRPC host setting takes, failed to start the gateway (gaierror)."""
    async with (
        reliable_gateway(metrics_port=0, metrics_host="[::1]") as h,
        httpx.AsyncClient() as http,
    ):
        reply = await http.get(f"http://[::1]:{h.gateway.metrics_port}/metrics")
    assert reply.status_code == 200


def test_a_tenant_named_other_is_not_the_overflow_label() -> None:
    """The overflow label was `other`, a valid tenant id: such a tenant's figures merged with
    the overflow, and deleting it deleted every overflow tenant's series."""
    metrics = GatewayMetrics(max_tenants=1)
    metrics.shed("other")
    metrics.shed("late")  # past max_tenants: the overflow
    metrics.forget_tenant("other")
    assert metrics.registry.get_sample_value("fairgate_shed_jobs_total", {"tenant": OTHER}) == 1


class Where(Collector):
    """A collector that notes the thread each scrape reads it in."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.get_ident())
        yield GaugeMetricFamily("where", "the thread that reads it", value=1)


async def test_a_scrape_writes_its_text_off_the_event_loop() -> None:
    """A scrape wrote every series on the event loop: at the default thousand tenants most of
    a second in which no tenant's call streamed."""
    metrics = GatewayMetrics()
    where = Where()
    metrics.registry.register(where)
    async with (
        serving_metrics(metrics, "127.0.0.1", 0) as port,
        httpx.AsyncClient() as http,
    ):
        reply = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert reply.status_code == 200 and "where 1.0" in reply.text
    assert where.threads and threading.get_ident() not in where.threads


def test_what_a_deleted_tenants_calls_do_as_they_end_brings_back_no_series() -> None:
    """Its calls cancelled with it end after its series were removed: they brought them back,
    for good, and took a label place from the tenants to come."""
    metrics = GatewayMetrics(max_tenants=2)
    metrics.shed("gone")
    metrics.recent.add("gone", 1.0, 5.0)
    metrics.forget_tenant("gone")
    metrics.shed("gone")  # as its cancelled job's call ends
    shed = "fairgate_shed_jobs_total"
    assert metrics.registry.get_sample_value(shed, {"tenant": "gone"}) is None
    assert metrics.registry.get_sample_value(shed, {"tenant": OTHER}) == 1
    assert "gone" not in metrics.recent.view(1.0)
    assert metrics.tenant("fresh") == "fresh"
    metrics.admitted("gone")  # a tenant of that id, created again, is admitted a job
    assert metrics.tenant("gone") == "gone"


async def test_a_scrape_is_gzipped_for_a_scraper_that_takes_it() -> None:
    """At the default thousand tenants a scrape was about 5 MB of text, sent whole every scrape
    interval though Prometheus asks for gzip."""
    metrics = GatewayMetrics()
    for k in range(200):
        metrics.shed(f"tenant-{k}")
    async with (
        serving_metrics(metrics, "127.0.0.1", 0) as port,
        httpx.AsyncClient() as http,
    ):
        url = f"http://127.0.0.1:{port}/metrics"
        zipped = await http.get(url, headers={"Accept-Encoding": "gzip"})
        plain = await http.get(url, headers={"Accept-Encoding": "identity"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert "content-encoding" not in plain.headers
    assert zipped.text == plain.text  # httpx decodes the gzipped body
    assert 'fairgate_shed_jobs_total{tenant="tenant-199"} 1.0' in plain.text
    assert zipped.num_bytes_downloaded * 5 < plain.num_bytes_downloaded
