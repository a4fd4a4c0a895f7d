"""`python -m bench.engine_speed.gpu`: the engine on a GPU, one prepared script for a lent machine.

No weights travel to the GPU machine, so the models are random-weight checkpoints at real
shapes (Qwen2.5-0.5B and Llama-3-8B configs), built on the device in bf16 and saved as
safetensors in a temporary folder. For each: a batch of random prompts is prefilled, then decode
runs at several batch sizes; reported are decode tokens/s and the fraction of the memory-bandwidth
roofline: each decode step must read every weight once plus every running sequence's KV, so the
roofline step time is (weight bytes + KV bytes) / bandwidth, with bandwidth measured in the same
run by a large device-to-device copy. `--tiny` runs the same path on a tiny config (CPU is fine),
which is how the script is tested where there is no GPU. Finishes in well under 10 minutes on an
H100/H200-class GPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

from engine import EngineConfig, LLMEngine, SamplingParams

SHAPES: dict[str, Any] = {
    "qwen2.5-0.5b": Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
    "llama-3-8b": LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    ),
    "tiny": LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
    ),
}


def memory_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large on-device copy (read + write), best of 5."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_checkpoint(name: str, folder: Path, device: torch.device) -> int:
    """Save a random bf16 model at the named shape; returns its parameter count."""
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            SHAPES[name], dtype=torch.bfloat16
        )
    model.save_pretrained(folder)
    params = int(sum(p.numel() for p in model.parameters()))
    del model
    _tokenizer(SHAPES[name].vocab_size).save_pretrained(folder)
    return params


def _tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the vocabulary's ids; prompts are token ids anyway."""
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, eos_token="t1"
    )


def run_model(
    name: str,
    device: torch.device,
    batches: list[int],
    prompt_len: int,
    decode_steps: int,
    bandwidth: float,
) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        params = build_checkpoint(name, folder, device)
        config = EngineConfig(
            model=str(folder),
            dtype="bfloat16",
            device=device.type,
            max_num_seqs=max(batches),
            max_num_batched_tokens=max(batches) * prompt_len,
            max_model_len=prompt_len + decode_steps + 8,
            enable_prefix_cache=False,
            kv_cache_bytes=(16 << 30) if device.type == "cuda" else (256 << 20),
        )
        llm = LLMEngine(config)
        shape = SHAPES[name]
        head_dim = (
            getattr(shape, "head_dim", None) or shape.hidden_size // shape.num_attention_heads
        )
        kv_per_token = 2 * shape.num_hidden_layers * shape.num_key_value_heads * head_dim * 2
        rows = []
        gen = torch.Generator().manual_seed(0)
        for batch in batches:
            prompts = torch.randint(
                2, shape.vocab_size, (batch, prompt_len), generator=gen
            ).tolist()
            params_ = SamplingParams(max_tokens=decode_steps, ignore_eos=True)
            for prompt in prompts:
                llm.add_request(prompt, params_, detokenize=False)
            while (
                any(r.num_output_tokens == 0 for r in llm.scheduler.running)
                or llm.scheduler.waiting
            ):
                llm.step()  # prefill (and the first token)
            _sync(device)
            start, tokens = time.perf_counter(), 0
            while llm.has_unfinished:
                tokens += sum(len(o.new_token_ids) for o in llm.step())
            _sync(device)
            elapsed = time.perf_counter() - start
            steps = decode_steps - 1
            mean_context = prompt_len + decode_steps / 2
            step_bytes = 2 * params + batch * mean_context * kv_per_token
            roofline_step_s = step_bytes / bandwidth
            rows.append(
                {
                    "batch": batch,
                    "decode_tok_s": tokens / elapsed,
                    "step_ms": 1e3 * elapsed / steps,
                    "roofline_fraction": roofline_step_s / (elapsed / steps),
                    "params": params,
                }
            )
            print(
                f"{name:<14} batch {batch:>4}: {tokens / elapsed:>9.0f} tok/s, "
                f"{1e3 * elapsed / steps:7.2f} ms/step, "
                f"{100 * roofline_step_s / (elapsed / steps):5.1f}% of the bandwidth roofline",
                flush=True,
            )
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "llama-3-8b"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=128)
    parser.add_argument("--tiny", action="store_true", help="tiny config, small batches (CPU ok)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.models, args.batches, args.prompt_len, args.decode_steps = ["tiny"], [1, 4], 16, 8
    bandwidth = memory_bandwidth(device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device {name}: measured copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    result = {
        "device": name,
        "bandwidth_gb_s": bandwidth / 1e9,
        "models": {
            m: run_model(m, device, args.batches, args.prompt_len, args.decode_steps, bandwidth)
            for m in args.models
        },
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
