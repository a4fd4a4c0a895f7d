"""The latency model's benchmark: completion-time error on a replayed Azure trace.

The first `n` calls of the Azure 2023 conversation trace arrive at their trace times
stretched by `time_scale`, with random prompt ids of their `ContextTokens` and exactly their
`GeneratedTokens` of output (EOS ignored), both clipped to what the engine serves. First a
warm-up batch calibrates the step-time model from measured steps; during the replay every
measured step feeds the model's online refit. When a call arrives, the latency model
estimates its completion from the engine's state, with true remaining lengths (so only the
latency model is judged, not the length predictor). Reported: MAPE of completion time and of
TTFT, measured from arrival. With the simulated runner the clock is the engine's modelled time;
with the real one, wall time.
"""

from __future__ import annotations

import csv
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.paths import existing
from engine import LLMEngine, Request, SamplingParams, StepShape, StepTimeModel
from engine.plan import StepOutput, StepPlan
from predictor.latency import LatencyModel, engine_state

AZURE_CONV = Path("traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")


@dataclass(frozen=True, slots=True)
class TraceCall:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


class RecordingRunner:
    """Wraps a runner and hands every executed step's shape and time to the latency model."""

    def __init__(self, inner: Any, latency: LatencyModel) -> None:
        self.inner, self.latency = inner, latency
        self.eos_token_ids: frozenset[int] = inner.eos_token_ids
        self.hidden_size: int = inner.hidden_size
        self.vocab_size: int = inner.vocab_size

    def execute(self, plan: StepPlan) -> StepOutput:
        start = time.perf_counter()
        out: StepOutput = self.inner.execute(plan)
        seconds = out.elapsed_s or time.perf_counter() - start
        self.latency.observe_step(StepShape.of(plan), seconds)
        return out


def load_trace(
    data_dir: Path, n: int, time_scale: float, max_prompt: int, max_output: int
) -> list[TraceCall]:
    with existing(data_dir / AZURE_CONV).open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:n]
    stamps = [np.datetime64(r["TIMESTAMP"][:26]) for r in rows]
    start = stamps[0]
    return [
        TraceCall(
            float((s - start) / np.timedelta64(1, "us")) / 1e6 * time_scale,
            max(1, min(int(r["ContextTokens"]), max_prompt)),
            max(1, min(int(r["GeneratedTokens"]), max_output)),
        )
        for s, r in zip(stamps, rows, strict=True)
    ]


def replay(
    llm: LLMEngine, trace: Sequence[TraceCall], latency: LatencyModel, simulated: bool
) -> dict[str, float]:
    """Run the trace; returns completion and TTFT MAPE and the call count."""
    rng = random.Random(0)
    vocab = 1000
    start = llm.now()
    predicted: dict[str, tuple[float, float, float]] = {}  # id -> arrival, ttft, completion
    pending = list(enumerate(trace))
    while pending or llm.has_unfinished:
        while pending and start + pending[0][1].arrival_s <= llm.now():
            i, call = pending.pop(0)
            prompt = [rng.randrange(1, vocab) for _ in range(call.prompt_tokens)]
            params = SamplingParams(max_tokens=call.output_tokens, ignore_eos=True)
            rid = llm.add_request(prompt, params, request_id=f"c{i:05d}", detokenize=False)
            latency.observe_arrival(llm.now(), call.prompt_tokens, call.output_tokens)
            sched = llm.scheduler
            state = engine_state(sched.running, sched.waiting, _true_remaining)
            ids = [r.request_id for r in sorted(sched.waiting, key=lambda r: r.sort_key)]
            est = latency.estimate_queue(state)[len(state.queue) - len(ids) + ids.index(rid)]
            predicted[rid] = (llm.now(), est.ttft_s, est.completion_s)
        if llm.has_unfinished:
            _finish(llm, predicted)
        elif pending:
            _wait_until(llm, start + pending[0][1].arrival_s, simulated)
    return _errors(predicted)


def _true_remaining(request: Request) -> int:
    return request.params.max_tokens - request.num_output_tokens


def _finish(llm: LLMEngine, predicted: dict[str, tuple[float, float, float]]) -> None:
    for out in llm.step():
        if out.finished and out.request is not None:
            r = out.request
            arrival, ttft, completion = predicted[r.request_id]
            assert r.first_token_time is not None and r.finish_time is not None
            predicted[r.request_id] = (
                arrival,
                ttft / max(r.first_token_time - arrival, 1e-9),
                completion / max(r.finish_time - arrival, 1e-9),
            )


def _wait_until(llm: LLMEngine, when: float, simulated: bool) -> None:
    if simulated:
        llm.virtual_time = max(llm.virtual_time, when)
    else:
        time.sleep(max(0.0, when - llm.now()))


def _errors(ratios: dict[str, tuple[float, float, float]]) -> dict[str, float]:
    ttft = np.array([abs(r[1] - 1) for r in ratios.values()])
    completion = np.array([abs(r[2] - 1) for r in ratios.values()])
    return {
        "completion_mape": float(completion.mean()),
        "ttft_mape": float(ttft.mean()),
        "completion_ape_p90": float(np.quantile(completion, 0.9)),
        "num_calls": float(len(ratios)),
    }


def calibrate(llm: LLMEngine, latency: LatencyModel, prompt_len: int = 256, n: int = 16) -> None:
    """Warm the engine up and fit the step model to the warm-up's measured steps."""
    rng = random.Random(1)
    prompts = [
        [rng.randrange(1, 1000) for _ in range(rng.randint(8, prompt_len))] for _ in range(n)
    ]
    params = [SamplingParams(max_tokens=rng.randint(8, 64), ignore_eos=True) for _ in prompts]
    latency.steps.refit_every = 1
    llm.generate(prompts, params)
    latency.steps.refit_every = 16


def run_latency_bench(
    llm: LLMEngine, data_dir: Path, n: int, time_scale: float, simulated: bool
) -> dict[str, float]:
    config = llm.config
    latency = LatencyModel(
        StepTimeModel(0.01, 0.001),
        token_budget=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
    )
    llm.runner = RecordingRunner(llm.runner, latency)
    calibrate(llm, latency)
    trace = load_trace(data_dir, n, time_scale, config.max_model_len // 2, 256)
    result = replay(llm, trace, latency, simulated)
    fitted = latency.step_model
    return {**result, "step_overhead_ms": fitted.overhead_s * 1e3,
            "step_per_token_ms": fitted.per_token_s * 1e3,
            "step_per_context_token_us": fitted.per_context_token_s * 1e6,
            "step_per_prefill_pair_ns": fitted.per_prefill_pair_s * 1e9}  # fmt: skip
