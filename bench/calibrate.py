"""`python -m bench.calibrate`: fit the simulated runner's step-time model to the real engine.

Runs the engine benchmark's workload (64 AlpacaEval prompts, Azure output lengths) through the
real engine, records every step's (batched tokens, context tokens, seconds), fits
`StepTimeModel` by least squares and writes it as JSON (the `cpu` regime of the scheduling
study and the admission benchmark read it). Also reports the fit's error on the steps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.workloads.engine_workload import build_engine_workload
from engine import EngineConfig, LLMEngine, SamplingParams, StepTimeModel

DEFAULT_OUT = Path(__file__).parent / "calibration" / "cpu_float32.json"


def measure_steps(
    llm: LLMEngine, prompts: list[list[int]], lens: list[int]
) -> list[tuple[int, int, float]]:
    for prompt, n in zip(prompts, lens, strict=True):
        llm.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True), detokenize=False)
    samples = []
    while llm.has_unfinished:
        llm.step()
        plan = llm.last_plan
        assert plan is not None
        context = sum(s.start_pos + len(s.token_ids) for s in plan.seqs)
        samples.append((plan.num_batched_tokens, context, llm.last_step_s))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--data", type=Path, default=Path(__file__).parents[1].parent / "shared" / "data"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    llm = LLMEngine(EngineConfig(dtype=args.dtype, num_threads=args.threads, max_num_seqs=64))
    workload = build_engine_workload(args.data, llm.tokenizer, n=args.requests)
    measure_steps(llm, workload.prompt_token_ids[:4], [8] * 4)  # warm-up
    samples = measure_steps(llm, workload.prompt_token_ids, workload.output_lens)
    model = StepTimeModel.fit(samples)
    data = np.asarray(samples)
    predicted = np.array([model.step_time(int(t), int(c)) for t, c, _ in samples])
    mape = float(np.mean(np.abs(predicted - data[:, 2]) / data[:, 2]))
    out = args.out or DEFAULT_OUT.with_name(f"cpu_{args.dtype}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "overhead_s": model.overhead_s,
        "per_token_s": model.per_token_s,
        "per_context_token_s": model.per_context_token_s,
        "steps": len(samples),
        "step_mape": mape,
        "dtype": args.dtype,
        "threads": args.threads,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


def load_step_model(path: Path = DEFAULT_OUT) -> StepTimeModel:
    record = json.loads(path.read_text())
    return StepTimeModel(record["overhead_s"], record["per_token_s"], record["per_context_token_s"])


if __name__ == "__main__":
    main()
