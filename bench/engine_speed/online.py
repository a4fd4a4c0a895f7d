"""`python -m bench.engine_speed.online`: online latency of the engine under Poisson arrivals.

Same workload as `bench.engine_speed.throughput` (64 AlpacaEval prompts, Azure output lengths,
greedy, exact lengths). First the offline capacity is measured in the same run (all requests
at once: requests/s); then the requests arrive as a Poisson process at 70% of it (numpy
`default_rng(seed)`) through the async front, and per request, as `vllm bench serve` defines
them: TTFT = first token - arrival; TPOT = (last token - first token) / (output tokens - 1);
ITL = the gaps between consecutive tokens. Reported: p50 and p99 of each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import anyio
import numpy as np

from bench.paths import add_data_flag
from bench.workloads.engine_workload import EngineWorkload, build_engine_workload
from engine import AsyncEngine, EngineConfig, LLMEngine, SamplingParams
from gateway.settings import DTYPES


async def replay(
    llm: LLMEngine, workload: EngineWorkload, rate: float, seed: int
) -> dict[str, list[float]]:
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(workload.output_lens))
    ttft: list[float] = []
    tpot: list[float] = []
    itl: list[float] = []

    async def one(prompt: list[int], n: int) -> None:
        arrival = time.monotonic()
        stream = engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
        stamps: list[float] = []
        async for delta in stream:
            stamps += [time.monotonic()] * len(delta.token_ids)
        ttft.append(stamps[0] - arrival)
        if len(stamps) > 1:
            tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
            itl.extend(b - a for a, b in itertools.pairwise(stamps))

    async with AsyncEngine(llm) as engine, anyio.create_task_group() as tg:
        for gap, prompt, n in zip(
            gaps, workload.prompt_token_ids, workload.output_lens, strict=True
        ):
            await anyio.sleep(float(gap))
            tg.start_soon(one, prompt, n)
    return {"ttft_s": ttft, "tpot_s": tpot, "itl_s": itl}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_data_flag(parser)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    llm = LLMEngine(EngineConfig(dtype=args.dtype, num_threads=args.threads), clock=time.monotonic)
    workload = build_engine_workload(args.data, llm.tokenizer)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    llm.generate(workload.prompt_token_ids[:4], params[:4])  # warm-up
    start = time.monotonic()
    llm.generate(workload.prompt_token_ids, params)
    capacity = len(params) / (time.monotonic() - start)
    rate = args.load * capacity
    samples = anyio.run(replay, llm, workload, rate, args.seed)
    result: dict[str, object] = {
        "capacity_req_s": capacity,
        "arrival_rate_req_s": rate,
        "load": args.load,
        "dtype": args.dtype,
    }
    for name, values in samples.items():
        ms = np.array(values) * 1e3
        result[name.replace("_s", "_ms")] = {
            "p50": float(np.percentile(ms, 50)),
            "p99": float(np.percentile(ms, 99)),
        }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
