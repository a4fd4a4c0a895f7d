"""Tiny random Llama and Qwen2 checkpoints, built once per test session from a fixed seed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY_SHAPE: dict[str, Any] = {
    "vocab_size": 384,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,  # a head size the CPU paged kernel serves, so the tests exercise it
    "max_position_embeddings": 512,
    "initializer_range": 0.2,  # peaked next-token distributions: greedy ties are implausible
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def tiny_config(family: str) -> PretrainedConfig:
    if family == "llama":
        return LlamaConfig(**TINY_SHAPE, tie_word_embeddings=True, rms_norm_eps=1e-5)
    if family == "qwen2":
        return Qwen2Config(**TINY_SHAPE, tie_word_embeddings=False)
    raise ValueError(family)


def build_tiny_model(family: str, seed: int = 0) -> PreTrainedModel:
    """A random fp32 model; norms and biases are perturbed too, so none is a silent identity."""
    torch.manual_seed(seed)
    config: Any = tiny_config(family)
    model: PreTrainedModel = (LlamaForCausalLM if family == "llama" else Qwen2ForCausalLM)(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    model.train(False)
    return model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`tiny_model_dir(family)`: the folder of a saved tiny model, family "llama" or "qwen2"."""
    built: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in built:
            folder = tmp_path_factory.mktemp(f"tiny-{family}")
            build_tiny_model(family).save_pretrained(folder)
            built[family] = folder
        return built[family]

    return make
