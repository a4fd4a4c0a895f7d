"""Compute ceiling of decode throughput: measured GEMM FLOP/s over the FLOPs of one token.

A token costs about 2 × params FLOPs (one multiply-add per weight; the tied embedding counts once,
as the LM head's matmul). The ceiling is the best FLOP/s of a large square matmul on the
benchmark's threads, divided by that: no engine on this machine can beat it in a dtype, whatever
its batching. Parameters are counted from the safetensors headers, without loading the model.
Run as `python -m bench.engine_speed.ceiling --model DIR --out FILE [--threads 2]` (a subprocess of
`bench.engine_speed.throughput`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

GEMM_SIZE = 2048
GEMM_REPS = 5
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def count_params(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                numel = 1
                for dim in f.get_slice(name).get_shape():
                    numel *= dim
                total += numel
    return total


def gemm_flops(dtype: str, threads: int, size: int = GEMM_SIZE, reps: int = GEMM_REPS) -> float:
    """Best FLOP/s of `size`³ matmuls over `reps` timed runs after one warm-up."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(size, size, dtype=getattr(torch, dtype))
    b = torch.randn(size, size, dtype=getattr(torch, dtype))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def ceiling(model_dir: Path, threads: int) -> dict[str, object]:
    params = count_params(model_dir)
    flops = {name: gemm_flops(dtype, threads) for name, dtype in DTYPES.items()}
    return {
        "params": params,
        "gemm_flops": flops,
        "ceiling_tok_s": {name: f / (2 * params) for name, f in flops.items()},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="GEMM FLOP/s ceiling of decode tokens/s")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    ns = parser.parse_args(argv)
    ns.out.write_text(json.dumps(ceiling(ns.model, ns.threads)), encoding="utf-8")


if __name__ == "__main__":
    main()
