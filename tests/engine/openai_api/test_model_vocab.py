"""Prompt ids against a real tiny model whose tokenizer knows more ids than the model has rows:
an id past the model's rows would fail the whole step it runs in, every request in it included."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine import EngineConfig, LLMEngine
from tests.engine.byte_tokenizer import byte_tokenizer
from tests.engine.conftest import TINY_SHAPE
from tests.engine.openai_api.conftest import MODEL, serving

pytestmark = pytest.mark.anyio

MODEL_ROWS = 260  # fewer than the byte tokenizer's ids


def short_vocab_model(folder: Path) -> Path:
    """A random tiny Llama of MODEL_ROWS rows saved with the byte tokenizer."""
    tokenizer = byte_tokenizer()
    assert len(tokenizer) > MODEL_ROWS
    torch.manual_seed(0)
    config = LlamaConfig(**{**TINY_SHAPE, "vocab_size": MODEL_ROWS}, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


async def test_a_prompt_id_the_model_has_no_row_for_is_refused_before_it_runs(
    tmp_path: Path,
) -> None:
    config = EngineConfig(
        model=str(short_vocab_model(tmp_path)), device="cpu", num_blocks=64, max_model_len=256
    )
    async with serving(LLMEngine(config)) as server:
        for _ in range(3):  # three failed steps in a row would turn /health to 503
            body = {"model": MODEL, "prompt": [5, MODEL_ROWS], "max_tokens": 2}
            response = await server.http.post("/v1/completions", json=body)
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["param"] == "prompt" and f"[0, {MODEL_ROWS})" in error["message"]
        assert (await server.http.get("/health")).status_code == 200
        body = {"model": MODEL, "prompt": [5, MODEL_ROWS - 1], "max_tokens": 2}
        completion = (await server.http.post("/v1/completions", json=body)).json()
        assert completion["usage"]["completion_tokens"] == 2
