"""`fairgate bench gateway`: what the gateway itself costs per call, through the whole gRPC path.

The engine is the simulated runner with instant steps (tokens cost nothing), quotas live in a
real Redis, and real gRPC clients send single-call `Generate` requests of one output token. So
everything measured is gateway: auth, validation, job admission, policy, quota reserve and
settle, backend bookkeeping, streaming. With `--backend openai` (the default) the engine is a
`fairgate engine serve --simulated` process behind the gateway's `openai` backend (HTTP, SSE,
metrics scraping: the path a gateway before a vLLM fleet takes); with `--backend local` it runs
in the gateway's process. The gateway runs in this process and the clients in another. Three
figures:
- throughput: `--clients` concurrent clients send `--calls` calls in all; calls/s;
- CPU per call: the gateway process's CPU time (all its threads) over the throughput phase, per
  call; on a machine shared with other work it moves much less than calls/s, so it is the
  figure to compare builds by there. The load generator's CPU per call is reported too: when it
  is the larger, calls/s is the load generator's limit, not the gateway's;
- added latency: one client, calls one after another (no queueing); p50 / p99 of the time from
  sending a call to its last response.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
import numpy as np

from bench.engine_servers import engine_servers
from engine.heap import freeze_startup_heap
from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.backends.settings import BackendSettings
from gateway.server import running_gateway
from gateway.settings import Settings
from tenants import RedisQuotaStore, TenantQuota

SERVED = "sim"  # the model id the engine server serves
ENGINE_SEQS = 64  # `fairgate engine serve`'s batch slots (the engine settings' default)


async def one_call(
    stub: gateway_pb2_grpc.GatewayStub, metadata: tuple[tuple[str, str]], max_tokens: int = 1
) -> float:
    """One `Generate` call of a short prompt, streamed to its end; its time in seconds."""
    request = pb.GenerateRequest(prompt="ping", sampling=pb.SamplingSpec(max_tokens=max_tokens))
    start = time.perf_counter()
    async for _ in stub.Generate(request, metadata=metadata):
        pass
    return time.perf_counter() - start


@dataclass(frozen=True, slots=True)
class GatewayRun:
    calls_per_s: float
    cpu_ms_per_call: float
    client_cpu_ms_per_call: float
    latency_p50_ms: float
    latency_p99_ms: float
    clients: int
    calls: int


async def load_client(
    port: int,
    keys: list[str],
    calls: int,
    clients: int,
    latency_calls: int,
    throughput_starts: Callable[[], None] = lambda: None,
) -> tuple[list[float], float, float, int]:
    """The load generator: sequential calls (latency), then `clients` concurrent ones.
    Returns the latencies, and the throughput phase's seconds, CPU seconds and calls."""
    metadata = [(("authorization", f"Bearer {key}"),) for key in keys]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        for _ in range(50):  # warm-up: connections, script loading, code paths
            await one_call(stub, metadata[0])
        latencies = [await one_call(stub, metadata[i % len(keys)]) for i in range(latency_calls)]
        per_client = calls // clients

        async def client(i: int) -> None:
            for _ in range(per_client):
                await one_call(stub, metadata[i % len(keys)])

        throughput_starts()
        start, cpu = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as tg:
            for i in range(clients):
                tg.start_soon(client, i)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        return latencies, elapsed, cpu, per_client * clients


def _client_process(args: tuple[int, list[str], int, int, int], out: Any) -> None:
    out.put(anyio.run(load_client, *args, lambda: out.put(None)))


async def measure(
    redis_url: str, calls: int, clients: int, latency_calls: int, backend: str
) -> GatewayRun:
    """One run: the gateway in this process, the clients in another."""
    async with contextlib.AsyncExitStack() as stack:
        settings = Settings(port=0, simulated_engine=True, policy="justitia", max_num_seqs=256)
        if backend == "openai":
            # imported here: torch and transformers (seconds) would be imported by every spawned
            # client of the benches that share `one_call`
            from engine.loader import resolve_model

            flags = ["--simulated", "--served-model-name", SERVED]
            (server,) = await stack.enter_async_context(engine_servers(1, flags))
            remote = BackendSettings(
                kind="openai",
                url=server.url,
                model=SERVED,
                tokenizer=resolve_model("default"),
                max_num_seqs=ENGINE_SEQS,
            )
            settings = settings.model_copy(update={"backends": [remote]})
        return await _measure(settings, redis_url, calls, clients, latency_calls)


async def _measure(
    settings: Settings, redis_url: str, calls: int, clients: int, latency_calls: int
) -> GatewayRun:
    store = RedisQuotaStore(redis_url, prefix=f"fgbench-{uuid.uuid4().hex[:8]}")
    tenants = [f"t{i}" for i in range(4)]
    async with running_gateway(settings, store=store) as gateway:
        freeze_startup_heap()  # as `fairgate serve` does once it is up
        keys = []
        unbounded = TenantQuota(max_concurrent_calls=0, max_queued_jobs=0, max_streams=0)
        for tenant in tenants:  # the benchmark measures the gateway, not a tenant's caps
            await store.create_tenant(tenant, tenant, unbounded)
            keys.append((await store.issue_key(tenant))[1])
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        job = (gateway.port, keys, calls, clients, latency_calls)
        process = context.Process(target=_client_process, args=(job, results))
        process.start()
        await anyio.to_thread.run_sync(results.get)  # the throughput phase starts
        cpu = time.process_time()
        latencies, elapsed, client_cpu, done = await anyio.to_thread.run_sync(results.get)
        cpu = time.process_time() - cpu
        await anyio.to_thread.run_sync(process.join)
        for tenant in tenants:
            usage = await store.usage(tenant)
            assert usage.active_reservations == 0, "a reservation leaked"
            await store.delete_tenant(tenant)
    ms = np.array(latencies) * 1e3
    p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    return GatewayRun(
        done / elapsed, cpu * 1e3 / done, client_cpu * 1e3 / done, p50, p99, clients, done
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--latency-calls", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--backend",
        choices=("openai", "local"),
        default="openai",
        help="a fairgate engine serve process over HTTP, or the engine in process",
    )
    args = parser.parse_args(argv)
    runs = [
        anyio.run(measure, args.redis, args.calls, args.clients, args.latency_calls, args.backend)
        for _ in range(args.repeats)
    ]
    result: dict[str, Any] = {
        "backend": args.backend,
        "calls_per_s": statistics.median(r.calls_per_s for r in runs),
        "cpu_ms_per_call": statistics.median(r.cpu_ms_per_call for r in runs),
        "client_cpu_ms_per_call": statistics.median(r.client_cpu_ms_per_call for r in runs),
        "added_latency_ms": {
            "p50": statistics.median(r.latency_p50_ms for r in runs),
            "p99": statistics.median(r.latency_p99_ms for r in runs),
        },
        "runs": [asdict(r) for r in runs],
    }
    print(
        f"gateway ({args.backend} backend): {result['calls_per_s']:.0f} calls/s "
        f"with {args.clients} clients "
        f"(CPU per call: gateway {result['cpu_ms_per_call']:.2f} ms, load generator "
        f"{result['client_cpu_ms_per_call']:.2f} ms); added "
        f"latency p50 {statistics.median(r.latency_p50_ms for r in runs):.2f} ms, p99 "
        f"{statistics.median(r.latency_p99_ms for r in runs):.2f} ms (median of {len(runs)} runs)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
