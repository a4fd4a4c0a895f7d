"""`fairgate bench replicas --json FILE`: the pool's share across replicas against per replica.

For each of `--rounds` rounds (the two arms' order rotated), a redis-server of the run's own (AOF
on, on a free port, emptied between arms) and one `fairgate engine serve --simulated` process
(steps of `--step-s` on the wall clock, `--slots` batch slots as the gateways see them); two
gateway replicas in this process (`bench/replicas/share.py`). Reports each arm's median share
error (the largest relative miss of a tenant's weight part of the KV token-time over the busy
period) and the runs. Only the share (point 2 of the replicas issue) is measured here yet.
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
from bench.replicas.share import ShareRun, measure_share
from engine.loader import resolve_model
from gateway.backends.settings import BackendSettings

SERVED = "bench-replicas"
ARMS = {"global": False, "per_replica": True}  # arm -> per_replica_share


def redis_server(directory: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    command = [
        "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
        "--appendonly", "yes", "--save", "", "--daemonize", "no",
    ]  # fmt: skip
    process = ServerProcess(command, {}, lambda line: "Ready to accept connections" in line)
    process.start(30.0)
    return process, f"redis://127.0.0.1:{port}/0"


async def study(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[ShareRun]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        redis, url = redis_server(directory)
        try:
            flags = ["--simulated", "--simulated-step-s", str(args.step_s)]
            async with engine_servers(1, [*flags, "--served-model-name", SERVED]) as (server,):
                backend = BackendSettings(
                    kind="openai",
                    url=server.url,
                    model=SERVED,
                    tokenizer=resolve_model("default"),
                    max_num_seqs=args.slots,
                    scrape_interval_s=0.05,
                )
                arms = list(ARMS)
                for round_ in range(args.rounds):
                    for arm in arms[round_ % 2 :] + arms[: round_ % 2]:
                        async with Redis.from_url(url) as client:
                            await client.flushall()
                        run = await measure_share(
                            url,
                            [backend],
                            directory,
                            per_replica=ARMS[arm],
                            jobs_per_tenant=args.jobs,
                            fanout=args.fanout,
                            max_tokens=args.max_tokens,
                        )
                        print(f"{arm}: parts {run.parts}, error {run.error:.3f}", flush=True)
                        runs[arm].append(run)
        finally:
            redis.stop()
    return {
        "share_error": {
            arm: statistics.median(r.error for r in done) for arm, done in runs.items()
        },
        "runs": {arm: [asdict(r) for r in done] for arm, done in runs.items()},
        "config": vars(args) | {"json": str(args.json)},
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="fairgate bench replicas", description=__doc__)
    p.add_argument("--json", type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=24, help="jobs per tenant")
    p.add_argument("--fanout", type=int, default=4, help="parallel calls per job")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--slots", type=int, default=8, help="batch slots the gateways see")
    p.add_argument("--step-s", type=float, default=0.01)
    args = p.parse_args(argv)
    result = anyio.run(study, args)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
