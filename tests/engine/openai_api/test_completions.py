"""POST /v1/completions through the openai SDK against a real server over the simulated engine."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import openai
import pytest
from openai.types import Completion, CompletionChoice

from engine.openai_api import completions
from engine.openai_api.completions import INLINE_PARSE_BYTES
from engine.openai_api.protocol import CompletionRequest, parse_request
from tests.engine.openai_api.conftest import (
    MAX_MODEL_LEN,
    MODEL,
    Server,
    serving,
    sim_core,
    until_idle,
)

pytestmark = pytest.mark.anyio

PROMPT = [5, 17, 42, 99, 120, 7, 8, 9, 10, 11]
SLOW_STEP_S = 0.02  # 400 tokens take 8 s: longer than `until_idle` waits for an abort
VLLM_FIELDS = {"min_tokens", "top_k", "ignore_eos", "priority", "request_id", "return_token_ids"}


def extra(choice: CompletionChoice, name: str) -> Any:
    """A vLLM extension field of a choice (the SDK keeps unknown fields as extras)."""
    assert choice.model_extra is not None
    return choice.model_extra.get(name)


async def stream_chunks(server: Server, **kwargs: Any) -> list[Completion]:
    stream = await server.openai.completions.create(model=MODEL, stream=True, **kwargs)
    return [chunk async for chunk in stream]


async def test_a_stream_with_include_usage_reports_the_tokens_the_engine_counted(
    server: Server,
) -> None:
    chunks = await stream_chunks(
        server,
        prompt=PROMPT,
        max_tokens=7,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True, "request_id": "streamed"},
    )
    *token_chunks, last = chunks
    assert last.choices == [] and last.usage is not None
    assert all(chunk.usage is None for chunk in token_chunks)
    token_ids = [t for chunk in token_chunks for t in extra(chunk.choices[0], "token_ids")]
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(PROMPT), 7)
    assert last.usage.total_tokens == len(PROMPT) + 7
    assert len(token_ids) == 7
    assert extra(token_chunks[0].choices[0], "prompt_token_ids") == PROMPT
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 6 + ["length"]
    metrics = await server.metrics()
    assert metrics["vllm:prompt_tokens_total"] == len(PROMPT)
    assert metrics["vllm:generation_tokens_total"] == 7
    whole = await server.openai.completions.create(  # the same id and prompt: the same tokens
        model=MODEL, prompt=PROMPT, max_tokens=7, extra_body={"request_id": "streamed"}
    )
    assert whole.choices[0].text == "".join(chunk.choices[0].text for chunk in token_chunks)


async def test_a_whole_completion_of_a_string_prompt(server: Server) -> None:
    completion = await server.openai.completions.create(
        model=MODEL,
        prompt="the quick brown fox",
        max_tokens=5,
        extra_body={"return_token_ids": True},
    )
    choice = completion.choices[0]
    prompt_ids = server.core.tokenizer.encode("the quick brown fox")
    assert extra(choice, "prompt_token_ids") == prompt_ids
    assert len(extra(choice, "token_ids")) == 5 and choice.finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        len(prompt_ids),
        5,
    )
    assert completion.model == MODEL and completion.object == "text_completion"


async def test_token_ids_are_left_out_unless_asked_for(server: Server) -> None:
    completion = await server.openai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert extra(completion.choices[0], "token_ids") is None


async def test_max_tokens_is_capped_by_what_the_context_leaves(server: Server) -> None:
    completion = await server.openai.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=100_000
    )
    assert completion.usage is not None
    assert completion.usage.completion_tokens == MAX_MODEL_LEN - len(PROMPT)
    assert completion.choices[0].finish_reason == "length"


async def test_a_stop_string_ends_the_text_and_min_tokens_holds_it_back(server: Server) -> None:
    async def complete(**kwargs: Any) -> tuple[str, str, int]:
        completion = await server.openai.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=40, extra_body={"request_id": "same", **kwargs}
        )
        assert completion.usage is not None
        choice = completion.choices[0]
        return choice.text, choice.finish_reason, completion.usage.completion_tokens

    full, reason, _ = await complete()  # the same id and prompt make the same tokens each time
    assert reason == "length" and full
    stop = full[0]
    text, reason, first_stop = await complete(stop=[stop])
    assert (text, reason) == ("", "stop")
    text, reason, held = await complete(stop=[stop], min_tokens=first_stop + 5)
    assert held >= first_stop + 5 and full.startswith(text)
    assert reason == ("stop" if held < 40 else "length")


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_tokens": 4, "min_tokens": 5}, None, "min_tokens must be in [0, max_tokens=4]"),
        ({"n": 2}, "n", "n: not supported"),
        ({"logprobs": 3}, "logprobs", "logprobs: not supported"),
        ({"prompt": [[1, 2], [3]]}, "prompt", "one prompt per request"),
        ({"prompt": [1, 100_000]}, "prompt", "prompt token ids must be in [0, "),
        ({"prompt": []}, "prompt", "the prompt is empty"),
        ({"prompt": [5] * MAX_MODEL_LEN}, "prompt", "leaves no room for output"),
        # too long is refused before its ids are scanned
        ({"prompt": [100_000] * MAX_MODEL_LEN}, "prompt", "leaves no room for output"),
        ({"temperature": -0.5}, None, "temperature must be 0 (greedy) or in"),
        ({"stop": [""]}, "stop", "stop strings must have 1 to"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "needs stream: true"),
        ({"top_p": "high"}, "top_p", "valid number"),
    ],
)
async def test_a_bad_request_is_a_400_naming_what_is_wrong(
    server: Server, body: dict[str, Any], param: str | None, message: str
) -> None:
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, **body}
    response = await server.http.post("/v1/completions", json=request)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error["message"]
    assert (error["param"], error["type"], error["code"]) == (param, "BadRequestError", 400)
    sdk = {k: v for k, v in request.items() if k not in VLLM_FIELDS}
    vllm = {k: v for k, v in request.items() if k in VLLM_FIELDS}
    with pytest.raises(openai.BadRequestError, match=re.escape(message)):
        await server.openai.completions.create(**sdk, extra_body=vllm)  # the SDK reads it too


@pytest.mark.parametrize(
    ("method", "path", "sent", "status"),
    [
        ("POST", "/v1/completions", {"json": {"model": "other", "prompt": [1]}}, 404),
        ("POST", "/v1/completions", {"content": b"{not json"}, 400),
        ("GET", "/v1/nothing-here", {}, 404),
        ("GET", "/v1/completions", {}, 405),
    ],
)
async def test_other_refusals_have_the_same_error_body(
    server: Server, method: str, path: str, sent: dict[str, Any], status: int
) -> None:
    response = await server.http.request(method, path, **sent)
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.json()["error"]["code"] == status


async def test_bodies_and_string_prompts_past_their_bounds_are_refused_unread() -> None:
    async with serving(sim_core(), max_body_bytes=1024, max_prompt_chars=100) as server:
        declared = await server.http.post("/v1/completions", content=b" " * 2048)
        assert declared.status_code == 413

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(4):
                yield b" " * 512

        streamed = await server.http.post("/v1/completions", content=chunks())
        assert streamed.status_code == 413
        long = await server.http.post("/v1/completions", json={"prompt": "x" * 101})
        assert long.status_code == 400 and "at most 100" in long.json()["error"]["message"]


@pytest.mark.engine_step_s(SLOW_STEP_S)
async def test_a_client_that_leaves_mid_stream_aborts_its_request(server: Server) -> None:
    stream = await server.openai.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=400, stream=True
    )
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == 3:
            break
    assert (await server.metrics())["vllm:num_requests_running"] == 1
    await stream.close()
    await until_idle(server)
    metrics = await server.metrics()
    assert metrics["vllm:num_requests_running"] == 0 and server.engine.num_live == 0
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0
    assert server.core.block_manager.num_used_blocks == 0


@pytest.mark.engine_step_s(SLOW_STEP_S)
async def test_a_request_id_in_use_is_refused_until_its_request_ends(server: Server) -> None:
    same_id = {"request_id": "call-1"}
    stream = await server.openai.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=400, stream=True, extra_body=same_id
    )
    async for _ in stream:
        break
    with pytest.raises(openai.ConflictError, match="call-1"):
        await server.openai.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=2, extra_body=same_id
        )
    await stream.close()
    await until_idle(server)
    assert not server.core.has_unfinished
    completion = await server.openai.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, extra_body=same_id
    )
    assert completion.id == "cmpl-call-1"


@pytest.mark.engine_step_s(SLOW_STEP_S)
async def test_a_client_that_leaves_before_a_whole_completion_aborts_its_request(
    server: Server,
) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 400}
    with pytest.raises(httpx.ReadTimeout):
        await server.http.post("/v1/completions", json=body, timeout=0.2)
    await until_idle(server)
    assert server.engine.num_live == 0 and server.core.block_manager.num_used_blocks == 0
    assert (await server.metrics())["vllm:num_requests_running"] == 0


async def test_a_large_body_is_parsed_off_the_event_loop_and_a_small_one_on_it(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body of megabytes parsed on the loop would stop every stream while it is read; a
    call's few kilobytes parse faster than a worker thread hands them back."""
    threads: list[int] = []

    def parse(body: bytes) -> CompletionRequest:
        threads.append(threading.get_ident())
        return parse_request(body)

    monkeypatch.setattr(completions, "parse_request", parse)
    fields = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
    small = json.dumps(fields).encode()
    large = small + b" " * INLINE_PARSE_BYTES  # the same request, padded past the limit
    for body in (small, large):
        response = await server.http.post("/v1/completions", content=body)
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2
    assert threads[0] == threading.get_ident() != threads[1]


def memory_kib(field: str) -> int:
    """A line of /proc/self/status (Linux), in KiB: VmRSS now, VmHWM its peak."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(f"{field}:"))
    return int(line.split()[1])


async def test_long_string_prompts_are_tokenized_one_at_a_time(server: Server) -> None:
    """Tokenizing takes ~800 bytes a character at worst (an emoji is 4 byte tokens, each with
    its string, offsets and masks): six 262,144-character prompts in as many worker threads at
    once took 1.2 GB, twenty 4 GB, for prompts far past max_model_len, refused afterwards."""
    body = {"model": MODEL, "prompt": "\N{GRINNING FACE}" * 262_144, "max_tokens": 1}
    statuses: list[int] = []

    async def send() -> None:
        statuses.append(
            (await server.http.post("/v1/completions", json=body, timeout=60)).status_code
        )

    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM starts again from the RSS now
    before = memory_kib("VmRSS")
    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(send)
    grown = (memory_kib("VmHWM") - before) << 10
    assert statuses == [400] * 6
    assert grown < 512 << 20, f"peak RSS grew by {grown >> 20} MB"
