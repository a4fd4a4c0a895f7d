"""Measure the real engine's step time on this machine and fit the cpu regime's step model.

Runs a few plans through `engine.model_runner.ModelRunner` on the default model (decode batches
of 1 to 32 sequences at contexts of 256 and 1024 tokens, and prefill chunks of 128 to 512
tokens, one of them after 512 tokens already prefilled), takes the median of `repeats` timings
each, and fits `StepTimeModel.fit` (non-negative least squares of relative errors on batched
tokens, context tokens and prefill attention pairs, so the big prefills do not decide the fit of
the decodes). Writes the JSON that `bench.sched --cpu-step-model` reads.
The model's KV content is garbage: only time is measured. Invariant: the fit is of measured
steps only; nothing is assumed.

    python -m bench.sim.calibrate --out cpu_step_model.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from engine import EngineConfig, SamplingParams, ScheduledSeq, StepPlan, StepShape, StepTimeModel

BLOCK = 16
PARAMS = SamplingParams(max_tokens=64)
DECODES = ((1, 256), (4, 256), (16, 256), (32, 256), (1, 1024), (8, 1024), (16, 1024))
PREFILLS = ((128, 0), (256, 0), (512, 0), (512, 512))  # (chunk tokens, start)


def decode_plan(batch: int, context: int) -> StepPlan:
    per = -(-context // BLOCK)
    seqs = [
        ScheduledSeq(
            f"d{i}", [100 + i], context - 1, list(range(i * per, (i + 1) * per)), True, PARAMS, 1
        )
        for i in range(batch)
    ]
    return StepPlan(seqs, batch)


def prefill_plan(tokens: int, start: int = 0) -> StepPlan:
    ids = [(7 * j) % 30000 + 10 for j in range(tokens)]
    blocks = list(range(-(-(start + tokens) // BLOCK)))
    return StepPlan([ScheduledSeq("p0", ids, start, blocks, True, PARAMS, 0)], tokens)


def measure(repeats: int, threads: int | None) -> list[tuple[StepShape, float]]:
    from engine.loader import resolve_model
    from engine.model_runner import ModelRunner

    config = EngineConfig(num_threads=threads, max_model_len=2048)
    runner = ModelRunner(resolve_model("default"), config, num_blocks=32 * 64 + 64)
    plans = [decode_plan(b, c) for b, c in DECODES] + [prefill_plan(t, s) for t, s in PREFILLS]
    samples = []
    for plan in plans:
        runner.execute(plan)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            runner.execute(plan)
            times.append(time.perf_counter() - start)
        shape = StepShape.of(plan)
        samples.append((shape, statistics.median(times)))
        print(
            f"tokens {shape.num_batched_tokens:4d} context {shape.context_tokens:6d} "
            f"prefill pairs {shape.prefill_pairs:7d}: {samples[-1][1] * 1e3:8.1f} ms",
            flush=True,
        )
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.sim.calibrate", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    model = StepTimeModel.fit(measure(args.repeats, args.threads), relative=True)
    data = dataclasses.asdict(model)
    args.out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
