"""`fairgate bench replicas --json FILE`: replicas on one Redis: what they lose, share and cost.

A redis-server of the run's own (AOF on, on a free port, emptied before every run), then three
studies (`--parts`); share and scale take `--rounds` rounds, arms rotated, medians:
- `kill` (`kill.py`, one run): three replica processes before two simulated servers, one killed
  with SIGKILL mid-run and started again; jobs lost and events seen twice by resuming watchers;
- `share` (`share.py`): two replicas in this process before one `fairgate engine serve
  --simulated` process (steps of `--step-s`, `--slots` batch slots as the gateways see them);
  each arm's share error (the largest relative miss of a tenant's weight part of the KV
  token-time over the busy period), with the pool's share and per replica;
- `scale` (`scale.py`): N = 1, 2, 3 `fairgate serve` processes before one instant simulated
  server; calls/s, added latency p50 / p99, the gateways' CPU and Redis round trips per call;
- `live` (`live.py`): the live check's workload and tiny model on one engine server behind 1 and
  3 replicas, every serving policy; the rankings and justitia's queueing over fcfs's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
from redis.asyncio import Redis

from bench.backends.process import ServerProcess, free_port
from bench.engine_servers import engine_servers
from bench.live.model import tiny_model
from bench.paths import add_data_flag
from bench.replicas.kill import RERUN, run_with_a_kill
from bench.replicas.live import live_study
from bench.replicas.scale import ScaleRun, measure_scale, medians
from bench.replicas.share import ShareRun, measure_share
from engine.loader import resolve_model
from fairgate.v1 import gateway_pb2 as pb
from gateway.backends.settings import BackendSettings

SERVED = "bench-replicas"
ARMS = {"global": False, "per_replica": True}  # arm -> per_replica_share
SCALE_REPLICAS = [1, 2, 3]


def redis_server(directory: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    command = [
        "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
        "--appendonly", "yes", "--save", "", "--daemonize", "no",
    ]  # fmt: skip
    process = ServerProcess(command, {}, lambda line: "Ready to accept connections" in line)
    process.start(30.0)
    return process, f"redis://127.0.0.1:{port}/0"


async def _flush(url: str) -> None:
    async with Redis.from_url(url) as client:
        await client.flushall()


def _backend(url: str, slots: int, scrape_interval_s: float = 0.2) -> BackendSettings:
    return BackendSettings(
        kind="openai",
        url=url,
        model=SERVED,
        tokenizer=resolve_model("default"),
        max_num_seqs=slots,
        scrape_interval_s=scrape_interval_s,
    )


async def share_study(args: argparse.Namespace, url: str, directory: Path) -> dict[str, Any]:
    runs: dict[str, list[ShareRun]] = {arm: [] for arm in ARMS}
    flags = ["--simulated", "--simulated-step-s", str(args.step_s)]
    async with engine_servers(1, [*flags, "--served-model-name", SERVED]) as (server,):
        arms = list(ARMS)
        for round_ in range(args.rounds):
            for arm in arms[round_ % 2 :] + arms[: round_ % 2]:
                await _flush(url)
                run = await measure_share(
                    url,
                    [_backend(server.url, args.slots, 0.05)],
                    directory,
                    per_replica=ARMS[arm],
                    jobs_per_tenant=args.jobs,
                    fanout=args.fanout,
                    max_tokens=args.max_tokens,
                )
                print(f"{arm}: parts {run.parts}, error {run.error:.3f}", flush=True)
                runs[arm].append(run)
    return {
        "share_error": {arm: statistics.median(r.error for r in rs) for arm, rs in runs.items()},
        "share_runs": {arm: [asdict(r) for r in rs] for arm, rs in runs.items()},
    }


async def scale_study(args: argparse.Namespace, url: str, directory: Path) -> dict[str, Any]:
    runs: dict[int, list[ScaleRun]] = {n: [] for n in SCALE_REPLICAS}
    async with engine_servers(1, ["--simulated", "--served-model-name", SERVED]) as (server,):
        for round_ in range(args.rounds):
            order = SCALE_REPLICAS[round_ % 3 :] + SCALE_REPLICAS[: round_ % 3]
            for n in order:
                await _flush(url)
                run = await measure_scale(
                    n,
                    url,
                    _backend(server.url, 64),
                    directory,
                    calls=args.calls,
                    clients=args.clients,
                    latency_calls=args.latency_calls,
                )
                print(f"{n} replicas: {run}", flush=True)
                runs[n].append(run)
    figures = {str(n): medians(rs) for n, rs in runs.items()}
    return {
        "calls_per_s": {n: f["calls_per_s"] for n, f in figures.items()},
        "added_latency_ms": {n: {"p50": f["p50"], "p99": f["p99"]} for n, f in figures.items()},
        "cpu_ms_per_call": {n: f["cpu_ms_per_call"] for n, f in figures.items()},
        "redis_round_trips_per_call": {
            n: f["redis_round_trips_per_call"] for n, f in figures.items()
        },
        "scale_runs": {str(n): [asdict(r) for r in rs] for n, rs in runs.items()},
    }


async def kill_study(args: argparse.Namespace, url: str, directory: Path) -> dict[str, Any]:
    flags = ["--simulated", "--simulated-step-s", "0.02", "--served-model-name", SERVED]
    async with engine_servers(2, flags) as servers:
        await _flush(url)
        run = await run_with_a_kill(url, [_backend(s.url, 64, 0.05) for s in servers], directory)
    reruns = sum(w.count(pb.NODE_STATE_READY, RERUN) for w in run.watchers)
    print(f"kill: {run.lost_jobs} lost, {run.duplicate_events} duplicate events", flush=True)
    return {
        "lost_jobs": run.lost_jobs,
        "duplicate_events": run.duplicate_events,
        "kill_run": {
            "jobs": len(run.watchers),
            "watchers_resumed": sum(bool(w.switches) for w in run.doomed),
            "reruns": reruns,
            "missing_events": run.gaps,
            "open_leases": run.open_leases,
            "settled_calls": sum(u.settled_calls for u in run.usage.values()),
        },
    }


async def live_check(args: argparse.Namespace, url: str, directory: Path) -> dict[str, Any]:
    model = tiny_model(directory / "model")
    settings = directory / "live-engine.toml"
    settings.write_text("kv_cache_mb = 1\n", encoding="utf-8")
    flags = ["--model", str(model), "--served-model-name", SERVED, "--config", str(settings)]
    async with engine_servers(1, flags) as (server,):
        return await live_study(
            args.data,
            directory,
            url,
            lambda: _flush(url),
            server.url,
            model,
            SERVED,
            args.rounds,
            args.server_priority,
        )


async def study(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        redis, url = redis_server(directory)
        try:
            if "kill" in args.parts:
                result |= await kill_study(args, url, directory)
            if "share" in args.parts:
                result |= await share_study(args, url, directory)
            if "scale" in args.parts:
                result |= await scale_study(args, url, directory)
            if "live" in args.parts:
                result |= await live_check(args, url, directory)
        finally:
            redis.stop()
    return result | {"config": vars(args) | {"json": str(args.json), "data": str(args.data)}}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="fairgate bench replicas", description=__doc__)
    p.add_argument("--json", type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=48, help="share: jobs per tenant")
    p.add_argument("--fanout", type=int, default=4, help="parallel calls per job")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--slots", type=int, default=8, help="batch slots the gateways see")
    p.add_argument("--step-s", type=float, default=0.01)
    p.add_argument("--parts", default="kill,share,scale,live", help="kill, share, scale, live")
    p.add_argument(
        "--server-priority",
        action="store_true",
        help="live: the server schedules by the priority the gateways send (a call's key)",
    )
    add_data_flag(p)
    p.add_argument("--calls", type=int, default=1200, help="scale: concurrent calls in all")
    p.add_argument("--clients", type=int, default=24, help="scale: concurrent clients")
    p.add_argument("--latency-calls", type=int, default=200, help="scale: calls one by one")
    args = p.parse_args(argv)
    result = anyio.run(study, args)
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("runs")}, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
