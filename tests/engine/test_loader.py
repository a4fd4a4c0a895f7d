"""Model resolution: local folders, clear errors, and the default SmolLM2 converted once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import safe_open

from engine.errors import ModelNotFound
from engine.loader import CACHE_ENV, DEFAULT_MODEL_NAME, load_tokenizer, resolve_model

SMOLLM2_CHAT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
)


def test_a_local_folder_resolves_to_itself(tiny_model_dir: Callable[[str], Path]) -> None:
    folder = tiny_model_dir("llama")
    assert resolve_model(str(folder)) == folder


def test_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="nope"):
        resolve_model(str(tmp_path / "nope"))


@pytest.mark.integration
def test_default_model_converts_once_into_a_plain_llama_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    leftover = tmp_path / "models" / f".{DEFAULT_MODEL_NAME}.crashed"
    leftover.mkdir(parents=True)  # what a killed conversion leaves behind: ignored
    folder = resolve_model("default")
    assert folder == tmp_path / "models" / DEFAULT_MODEL_NAME
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    with safe_open(folder / "model.safetensors", framework="pt") as weights:
        assert "model.layers.29.mlp.down_proj.weight" in set(weights.keys())
    tokenizer = load_tokenizer(folder)
    chat = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        SMOLLM2_CHAT
    )
    assert tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("default") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted(
        [DEFAULT_MODEL_NAME, leftover.name]
    )
