"""`python -m bench.engine_speed.admission`: does prediction-aware KV admission pay?

Workload: AlpacaEval prompts with SmolLM2's chat template, true output lengths drawn from the
Azure conversation trace (numpy `default_rng(seed)`), every request with max_tokens = 1024, all
submitted at once, up to 256 running at once (vLLM's default max_num_seqs). KV budget: a third
of the worst case of a 64-request batch, `64 * (mean prompt + max_tokens) / 3` tokens. The
engine is the real scheduler and block manager with the simulated runner (the scheduling
study's step models: `cpu`, or a file measured by `python -m bench.sim.calibrate`, and `gpu`),
which stops each request at its true length.

Three admission modes: reserve nothing ahead (vLLM), prompt + max_tokens (worst case), prompt +
predicted length, the last with oracle predictions and with ±50% multiplicative noise
(uniform in [0.5, 1.5]). Reported per mode: mean concurrency (running requests per step,
weighted by step time), preemptions, recomputed tokens, and useful output tokens/s.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.paths import add_data_flag
from bench.sim.regime import CPU_STEP_MODEL, GPU_STEP_MODEL, load_step_model
from bench.workloads.engine_workload import build_engine_workload, sample_output_lens
from engine import (
    EngineConfig,
    LLMEngine,
    ReserveMode,
    SamplingParams,
    SimulatedRunner,
    StepTimeModel,
)
from engine.loader import load_tokenizer, resolve_model

MAX_TOKENS = 1024
BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class Outcome:
    mode: str
    throughput_tok_s: float
    mean_concurrency: float
    preemptions: int
    recomputed_tokens: int
    makespan_s: float


def run_mode(
    prompts: list[list[int]],
    lengths: list[int],
    predictions: list[int] | None,
    mode: ReserveMode,
    num_blocks: int,
    max_num_seqs: int,
    step_model: StepTimeModel,
) -> tuple[float, float, int, int]:
    config = EngineConfig(
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=512,
        max_model_len=4096,
        reserve_mode=mode,
        enable_prefix_cache=False,
    )
    runner = SimulatedRunner(step_model, vocab_size=49152, eos_token_id=0)
    llm = LLMEngine(config, runner=runner, num_blocks=num_blocks)
    requests = []
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        predicted = predictions[i] if predictions is not None else None
        rid = llm.add_request(
            prompt,
            SamplingParams(max_tokens=MAX_TOKENS),
            predicted_output_len=predicted,
            detokenize=False,
        )
        runner.set_output_length(rid, n)
        requests.append(rid)
    busy = weighted = 0.0
    finished = []
    while llm.has_unfinished:
        running = len(llm.scheduler.running)
        before = llm.virtual_time
        finished += [o.request for o in llm.step() if o.finished and o.request is not None]
        spent = llm.virtual_time - before
        busy += spent
        weighted += spent * max(running, len(llm.scheduler.running))
    recomputed = sum(r.num_recomputed_tokens for r in finished)
    return busy, weighted / busy, llm.scheduler.num_preemptions, recomputed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_data_flag(parser)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=256)  # vLLM's default
    parser.add_argument("--batch", type=int, default=64, help="the batch whose worst case sizes KV")
    parser.add_argument(
        "--step-model",
        default="cpu",
        help="'cpu' (the study's cpu regime), 'gpu' (its memory-bound GPU model) or a JSON file "
        "written by `python -m bench.sim.calibrate`",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tokenizer = load_tokenizer(resolve_model("default"))
    prompts = build_engine_workload(args.data, tokenizer, n=args.requests).prompt_token_ids
    lengths = sample_output_lens(args.data, args.requests, args.seed, lo=1, hi=MAX_TOKENS)
    rng = np.random.default_rng(args.seed + 1)
    noisy = [
        max(1, round(n * f))
        for n, f in zip(lengths, rng.uniform(0.5, 1.5, len(lengths)), strict=True)
    ]
    mean_prompt = sum(map(len, prompts)) / len(prompts)
    budget_tokens = args.batch * (mean_prompt + MAX_TOKENS) / 3
    num_blocks = int(budget_tokens // BLOCK_SIZE)
    named = {"cpu": CPU_STEP_MODEL, "gpu": GPU_STEP_MODEL}
    step_model = named.get(args.step_model) or load_step_model(Path(args.step_model))
    cases = [
        ("reserve-nothing", ReserveMode.NONE, None),
        ("reserve-max", ReserveMode.MAX, None),
        ("predicted-oracle", ReserveMode.PREDICTED, lengths),
        ("predicted-noisy50", ReserveMode.PREDICTED, noisy),
    ]
    useful = sum(lengths)
    outcomes = []
    for name, mode, predictions in cases:
        makespan, concurrency, preemptions, recomputed = run_mode(
            prompts, lengths, predictions, mode, num_blocks, args.max_num_seqs, step_model
        )
        outcomes.append(
            Outcome(name, useful / makespan, concurrency, preemptions, recomputed, makespan)
        )
    base = next(o for o in outcomes if o.mode == "reserve-max").throughput_tok_s
    print(
        f"{args.requests} requests, max_tokens {MAX_TOKENS}, KV budget {num_blocks} blocks "
        f"({num_blocks * BLOCK_SIZE} tokens), step model {args.step_model}"
    )
    header = ("mode", "tok/s", "vs max", "concurrency", "preemptions", "recomputed")
    print("".join(f"{h:>13}" if i else f"{h:<20}" for i, h in enumerate(header)))
    for o in outcomes:
        print(
            f"{o.mode:<20}{o.throughput_tok_s:>13.1f}{o.throughput_tok_s / base:>13.2f}"
            f"{o.mean_concurrency:>13.1f}{o.preemptions:>13}{o.recomputed_tokens:>13}"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))


if __name__ == "__main__":
    main()
