"""fairgate's own engine under the benchmark protocol: one offline `LLMEngine.generate` call.

Each request asks for exactly its length with `ignore_eos=True`, greedy. `EngineConfig.model` is
"default" (the engine resolves SmolLM2 itself) or the folder passed with `--model`.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.engine_speed.peers.protocol import Generate, parse_worker_args, run_benchmark


def load_fairgate(model: str, dtype: str, threads: int) -> Generate:
    from engine import EngineConfig, LLMEngine, SamplingParams

    llm = LLMEngine(EngineConfig(model=model, dtype=dtype, num_threads=threads))

    def generate(prompts: Sequence[list[int]], lens: Sequence[int]) -> list[list[int]]:
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lens]
        return [list(out.output_token_ids) for out in llm.generate(list(prompts), params)]

    return generate


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_worker_args(argv)
    run_benchmark(args, lambda: load_fairgate(args.model, args.dtype, args.threads))


if __name__ == "__main__":
    main()
