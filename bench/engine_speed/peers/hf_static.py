"""Peer: HuggingFace `generate` on static batches of 16 requests, left-padded, greedy.

Requests are cut into batches of 16 in workload order; each batch runs until its longest request's
length (min = max new tokens; EOS is unset, so it neither stops a row nor is suppressed), and each
request keeps only its own length. The tail computed for shorter requests is the cost of static
batching that this peer shows: it counts as time, never as useful tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.engine_speed.peers.protocol import Generate, parse_worker_args, run_benchmark

BATCH_SIZE = 16


def load_hf_model(model_dir: str, dtype: str, threads: int) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    # generate() fills unset fields from here: without EOS nothing stops early or gets masked, so
    # greedy tokens stay comparable with engines that ignore EOS without suppressing it.
    model.generation_config.eos_token_id = None
    return model.eval()


def left_pad(prompts: Sequence[list[int]], pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    width = max(len(p) for p in prompts)
    ids = [[pad_id] * (width - len(p)) + list(p) for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask


def make_generate(model: Any) -> Generate:
    import torch
    from transformers import GenerationConfig

    pad_id = int(model.config.pad_token_id or 0)

    @torch.inference_mode()
    def generate(prompts: Sequence[list[int]], lens: Sequence[int]) -> list[list[int]]:
        outputs: list[list[int]] = []
        for start in range(0, len(prompts), BATCH_SIZE):
            batch_lens = lens[start : start + BATCH_SIZE]
            ids, mask = left_pad(prompts[start : start + BATCH_SIZE], pad_id)
            steps = max(batch_lens)
            config = GenerationConfig(  # type: ignore[no-untyped-call]
                max_new_tokens=steps,
                min_new_tokens=steps,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=pad_id,
            )
            out = model.generate(
                input_ids=torch.tensor(ids),
                attention_mask=torch.tensor(mask),
                generation_config=config,
            )
            new = out[:, len(ids[0]) :].tolist()
            outputs.extend(row[:n] for row, n in zip(new, batch_lens, strict=True))
        return outputs

    return generate


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_worker_args(argv)
    run_benchmark(args, lambda: make_generate(load_hf_model(args.model, args.dtype, args.threads)))


if __name__ == "__main__":
    main()
