"""What N gateway replicas cost per call: throughput, added latency, CPU and Redis round trips.

N `fairgate serve` processes (`gateways.py`, redis store, justitia; every call takes the
pool's grant) in front of one `fairgate engine serve --simulated` process with instant steps, so
everything measured is gateway. The clients, in this process, send single-call `Generate`
requests of one output token, spread over the replicas round robin: first `latency_calls` one
after another (no queueing: p50 / p99 of a call's time, the latency the gateway adds), then
`clients` concurrent ones, `calls` in all (calls/s). Over the concurrent phase, the gateways' CPU
time (from /proc, every replica's added up) per call, and their Redis round trips per call (their
`fairgate_redis_round_trips_total`, background renewals and publishes included). On a 2-core
machine the replicas and the clients share the CPU, so CPU per call is the figure to compare N by.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import grpc
import numpy as np

from bench.backends.process import free_port
from bench.engine_servers import server_metric
from bench.gateway_overhead import one_call
from bench.replicas import ADMIN_KEY
from bench.replicas.gateways import GatewayReplica, running
from fairgate import AdminClient
from fairgate.v1 import gateway_pb2_grpc
from gateway.backends.settings import BackendSettings

TENANTS = ("s0", "s1", "s2", "s3")
WARM_UP_CALLS = 30  # per replica: connections, scripts loaded, code paths taken


@dataclass(frozen=True, slots=True)
class ScaleRun:
    replicas: int
    calls_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    cpu_ms_per_call: float  # the gateways' CPU, all replicas together, per call
    client_cpu_ms_per_call: float
    redis_round_trips_per_call: float
    calls: int


def _cpu_s(pid: int) -> float:
    """A process's CPU time (user + system, all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _round_trips(metrics_ports: list[int]) -> float:
    name = "fairgate_redis_round_trips_total"
    return sum([await server_metric(f"http://127.0.0.1:{port}", name) for port in metrics_ports])


async def measure_scale(
    replicas: int,
    redis_url: str,
    backend: BackendSettings,
    directory: Path,
    *,
    calls: int,
    clients: int,
    latency_calls: int,
) -> ScaleRun:
    ports = [free_port() for _ in range(replicas)]
    gateways = [
        GatewayReplica(
            f"scale{replicas}-{i}",
            redis_url,
            directory,
            [backend],
            {"admin_key": ADMIN_KEY, "metrics_port": str(port), "policy": "justitia"},
        )
        for i, port in enumerate(ports)
    ]
    async with running(gateways):
        return await _drive(gateways, ports, calls, clients, latency_calls)


async def _drive(
    gateways: list[GatewayReplica],
    metrics_ports: list[int],
    calls: int,
    clients: int,
    latency_calls: int,
) -> ScaleRun:
    keys = []
    async with AdminClient(gateways[0].target, ADMIN_KEY) as admin:
        for tenant in TENANTS:  # the benchmark measures the gateways, not a tenant's caps
            await admin.create_tenant(
                tenant, max_concurrent_calls=0, max_queued_jobs=0, max_streams=0
            )
            keys.append((("authorization", f"Bearer {(await admin.issue_key(tenant)).plaintext}"),))
    channels = [grpc.aio.insecure_channel(g.target) for g in gateways]
    stubs = [gateway_pb2_grpc.GatewayStub(c) for c in channels]
    try:
        for i in range(WARM_UP_CALLS * len(stubs)):
            await one_call(stubs[i % len(stubs)], keys[i % len(keys)])
        latencies = [
            await one_call(stubs[i % len(stubs)], keys[i % len(keys)]) for i in range(latency_calls)
        ]
        per_client = calls // clients

        async def client(i: int) -> None:
            for _ in range(per_client):
                await one_call(stubs[i % len(stubs)], keys[i % len(keys)])

        trips = await _round_trips(metrics_ports)
        cpu = sum(_cpu_s(g.pid) for g in gateways)
        start, client_cpu = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as tg:
            for i in range(clients):
                tg.start_soon(client, i)
        elapsed, client_cpu = time.perf_counter() - start, time.process_time() - client_cpu
        cpu = sum(_cpu_s(g.pid) for g in gateways) - cpu
        trips = await _round_trips(metrics_ports) - trips
    finally:
        for channel in channels:
            await channel.close()
    done = per_client * clients
    ms = np.array(latencies) * 1e3
    return ScaleRun(
        len(gateways),
        done / elapsed,
        float(np.percentile(ms, 50)),
        float(np.percentile(ms, 99)),
        cpu * 1e3 / done,
        client_cpu * 1e3 / done,
        trips / done,
        done,
    )


def medians(runs: list[ScaleRun]) -> dict[str, float]:
    """The runs' medians of each figure."""
    return {
        "calls_per_s": statistics.median(r.calls_per_s for r in runs),
        "p50": statistics.median(r.latency_p50_ms for r in runs),
        "p99": statistics.median(r.latency_p99_ms for r in runs),
        "cpu_ms_per_call": statistics.median(r.cpu_ms_per_call for r in runs),
        "redis_round_trips_per_call": statistics.median(r.redis_round_trips_per_call for r in runs),
    }
