"""The live check's model: a tiny random Llama with the default model's tokenizer, that never stops.

Two layers of width 128 (a step costs a few milliseconds on a CPU core), SmolLM2's tokenizer (so
filler prompts tokenize like the default model's), random weights from a fixed seed. The
end-of-sequence tokens' embedding rows are zero; the embeddings are tied, so their logit is 0
while some other token's is positive, and greedy decoding never ends a call before its
max_tokens: every call produces exactly the output length the workload asks for, as the
simulation assumes. Written once into `folder` (a local checkpoint the engine loads by path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.loader import load_tokenizer, resolve_model

SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "initializer_range": 0.2,
}


def tiny_model(folder: Path, seed: int = 0) -> Path:
    """The checkpoint folder, built on first use."""
    if (folder / "config.json").is_file():
        return folder
    tokenizer = load_tokenizer(resolve_model("default"))
    eos = int(tokenizer.eos_token_id)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **SHAPE,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    embeddings = model.get_input_embeddings()
    assert isinstance(embeddings, torch.nn.Embedding)
    with torch.no_grad():
        embeddings.weight[eos].zero_()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
