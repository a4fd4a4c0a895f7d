"""The contract between `bench.engine_speed.throughput` and its per-engine worker subprocesses.

A worker reads the workload file (prompt token ids and exact output lengths), loads its engine
(timed as start-up), runs a short warm-up, then generates the whole workload `reps` times, timing
each repetition as wall time around one blocking generate call. It writes one JSON result. Useful
output tokens/s = sum of the requested lengths / wall time, whatever padding the engine computed.
Invariant: a result is written only when every request got exactly its requested length.
Standard library only: the vLLM worker imports this from a virtualenv without the project's deps.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.errors import WrongOutputLength

WARMUP_REQUESTS = 4
WARMUP_TOKENS = 8
KV_CACHE_GIB = 2  # the KV budget given to peers that size their cache from free memory

Generate = Callable[[Sequence[list[int]], Sequence[int]], list[list[int]]]


@dataclass(frozen=True, slots=True)
class WorkerArgs:
    model: str  # a local HF folder, or "default" for fairgate's own resolution
    workload: Path
    dtype: str  # "float32" | "bfloat16"
    reps: int
    out: Path
    threads: int  # torch / OpenMP threads of the engine


@dataclass(frozen=True, slots=True)
class WorkerResult:
    startup_s: float
    wall_s: list[float]
    tok_s: list[float]
    output_token_ids: list[list[int]]  # from the last repetition, cut to each requested length


def parse_worker_args(argv: Sequence[str] | None = None) -> WorkerArgs:
    parser = argparse.ArgumentParser(description="benchmark worker for one engine")
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    ns = parser.parse_args(argv)
    return WorkerArgs(ns.model, ns.workload, ns.dtype, ns.reps, ns.out, ns.threads)


def worker_argv(args: WorkerArgs) -> list[str]:
    return [
        *("--model", args.model, "--workload", str(args.workload)),
        *("--dtype", args.dtype, "--reps", str(args.reps), "--out", str(args.out)),
        *("--threads", str(args.threads)),
    ]


def load_workload(path: Path) -> tuple[list[list[int]], list[int]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["prompt_token_ids"], data["output_lens"]


def run_benchmark(args: WorkerArgs, load: Callable[[], Generate]) -> WorkerResult:
    """Time `load()`, warm up, run the workload `args.reps` times, write and return the result."""
    prompts, lens = load_workload(args.workload)
    start = time.perf_counter()
    generate = load()
    startup_s = time.perf_counter() - start
    generate(prompts[:WARMUP_REQUESTS], [WARMUP_TOKENS] * WARMUP_REQUESTS)
    walls: list[float] = []
    outputs: list[list[int]] = []
    for _ in range(args.reps):
        start = time.perf_counter()
        outputs = generate(prompts, lens)
        walls.append(time.perf_counter() - start)
        check_lengths(outputs, lens)
    useful = sum(lens)
    result = WorkerResult(startup_s, walls, [useful / w for w in walls], outputs)
    args.out.write_text(json.dumps(asdict(result)), encoding="utf-8")
    return result


def read_result(path: Path) -> WorkerResult:
    return WorkerResult(**json.loads(path.read_text(encoding="utf-8")))


def check_lengths(outputs: Sequence[Sequence[int]], lens: Sequence[int]) -> None:
    got = [len(o) for o in outputs]
    if got != list(lens):
        bad = [i for i, (g, n) in enumerate(zip(got, lens, strict=False)) if g != n]
        raise WrongOutputLength(f"requests {bad[:8]} of {len(got)} got the wrong number of tokens")
