"""Engine regimes of the study: a step-time model and how big the engine is.

`gpu`: a memory-bound decode engine (an H100-class GPU serving a mid-size model): a step costs a
fixed 15 ms (reading the weights), 20 µs per batched token (prefill compute) and 0.01 µs per
context token (KV reads), so a decode step is nearly flat in batch size; the KV pool holds
`kv_calls = 32` average calls of the workload and is the binding limit (no sequence cap that
binds). `cpu`: this machine's engine, compute-bound: the step model is measured, passed as a JSON
file (`overhead_s`, `per_token_s`, `per_context_token_s`, `per_prefill_pair_s`) or
`CPU_STEP_MODEL` (measured on one of these machines); the KV pool holds 64 average calls, 128
sequences, 512 batched tokens a step (the engine's defaults).
Its knee is the decode batch at which throughput reaches 80 % of its asymptote
(`engine.step_fit.knee_calls` without a batch limit), with the mean context a decoding call
reads. Invariant: every
regime admits by `ReserveMode.PREDICTED` and its pool holds any single call of the workload.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from bench.sim.errors import StepModelInvalid
from engine import EngineConfig, ReserveMode, StepTimeModel
from engine.step_fit import knee_calls

GPU_STEP_MODEL = StepTimeModel(overhead_s=0.015, per_token_s=2e-5, per_context_token_s=1e-8)
# SmolLM2-135M fp32 on the real engine, 2 cores of an Intel Xeon (Sapphire Rapids), measured by
# `python -m bench.sim.calibrate` on 2026-11-30 (relative fit; docs/BENCHMARKS.md, "Fair
# scheduling"). Another machine: calibrate there and pass the file with --cpu-step-model.
CPU_STEP_MODEL = StepTimeModel(overhead_s=0.0374, per_token_s=1.052e-3, per_context_token_s=2.30e-6)
BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class Regime:
    name: str
    step_model: StepTimeModel
    kv_calls: float  # KV pool size, in average calls (prompt + output) of the workload
    max_num_seqs: int
    max_num_batched_tokens: int
    use_knee: bool  # justitia is told the knee (a compute-bound engine)

    def num_blocks(self, mean_call_tokens: float, largest_call_tokens: int) -> int:
        tokens = max(self.kv_calls * mean_call_tokens, 2.0 * largest_call_tokens)
        return math.ceil(tokens / BLOCK_SIZE)

    def engine_config(self, max_model_len: int, num_blocks: int) -> EngineConfig:
        return EngineConfig(
            block_size=BLOCK_SIZE,
            num_blocks=num_blocks,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_prefix_cache=False,  # synthetic prompt tokens share nothing
            reserve_mode=ReserveMode.PREDICTED,
        )

    def knee_calls(self, mean_context: float) -> int | None:
        if not self.use_knee:
            return None
        return knee_calls(self.step_model, mean_context)


def gpu_regime() -> Regime:
    return Regime("gpu", GPU_STEP_MODEL, 32.0, 1024, 8192, use_knee=False)


def cpu_regime(step_model: StepTimeModel = CPU_STEP_MODEL) -> Regime:
    return Regime("cpu", step_model, 64.0, 128, 512, use_knee=True)


def load_step_model(path: Path) -> StepTimeModel:
    """A step model from a JSON object with overhead_s, per_token_s and optionally
    per_context_token_s and per_prefill_pair_s (0 when absent)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = StepTimeModel(
            float(data["overhead_s"]),
            float(data["per_token_s"]),
            float(data.get("per_context_token_s", 0.0)),
            float(data.get("per_prefill_pair_s", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StepModelInvalid(f"{path}: {exc!r}") from exc
    coefficients = dataclasses.astuple(model)
    if not all(math.isfinite(c) and c >= 0 for c in coefficients) or model.overhead_s <= 0:
        raise StepModelInvalid(f"{path}: coefficients must be finite, >= 0, overhead > 0")
    return model
