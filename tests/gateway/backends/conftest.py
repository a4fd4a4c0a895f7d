"""A real `fairgate engine serve` app and `OpenAIBackend`s on it.

The app is the engine's own (`build_app`), over the simulated engine and the engine tests' small
byte-level tokenizer, served by uvicorn on port 0, behind a `Gate`: an ASGI wrapper through which
a test makes a route fail with the status it names, demands an API key, or has the text's line
separators sent raw (as vLLM sends them). The tokenizer the backend checks against is the same
tokenizer saved to a folder. The simulated engine's tokens are a hash of the request
id and position and never end-of-sequence: a call makes exactly max_tokens, and the same request
id and prompt make the same tokens. `step_s` > 0 makes each engine step take that long, so a
test can act while a call runs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine import AsyncEngine, LLMEngine, SamplingParams
from engine.loader import load_tokenizer
from engine.openai_api import build_app, listening_socket, running_server
from gateway.backends import BackendCall, BackendSettings, OpenAIBackend
from tests.engine.byte_tokenizer import byte_tokenizer
from tests.engine.simulated import sim_core as simulated_core

MODEL = "fairgate-sim"
NUM_BLOCKS = 256
BLOCK_SIZE = 16
MAX_MODEL_LEN = 2048
SCRAPE_S = 0.02  # short, so that waiting for a scrape is quick
SLOW_STEP_S = 0.02  # 500 tokens take 10 s: longer than any bounded wait here


@dataclass
class Gate:
    """In front of the app: routes that fail (with their status), and an API key every request
    must carry."""

    app: ASGIApp
    failing: dict[str, int] = field(default_factory=dict)
    seen: Counter[str] = field(default_factory=Counter)  # requests by path
    api_key: str | None = None
    # send U+0085, U+2028 and U+2029 raw, as vLLM does (fairgate's server escapes them)
    raw_separators: bool = False
    # completions answered by a script instead of the app: the request's body in, the
    # response's body out, chunk by chunk; an exception drops the connection, as a server
    # that dies does
    script: Callable[[dict[str, Any]], AsyncIterator[bytes]] | None = None
    metrics: bytes | None = None  # `/metrics` answers this instead of the app's text
    metrics_encoding: bytes | None = None  # the Content-Encoding `metrics` is sent with
    # paths answered 200 with the body a function makes, chunk by chunk, instead of the app's
    bodies: dict[str, Callable[[], AsyncIterator[bytes]]] = field(default_factory=dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen[scope["path"]] += 1
            headers = dict(scope["headers"])
            wanted = f"Bearer {self.api_key}".encode()
            if self.api_key is not None and headers.get(b"authorization") != wanted:
                return await _answer(send, 401, b'{"error": {"message": "bad key", "code": 401}}')
            status = self.failing.get(scope["path"])
            if status is not None:
                body = json.dumps({"error": {"message": "it failed", "code": status}})
                return await _answer(send, status, body.encode())
            if self.metrics is not None and scope["path"] == "/metrics":
                encoding = self.metrics_encoding
                extra = [] if encoding is None else [(b"content-encoding", encoding)]
                return await _answer(send, 200, self.metrics, b"text/plain", extra)
            made = self.bodies.get(scope["path"])
            if made is not None:
                return await _streamed(made(), send)
            if self.script is not None and scope["path"] == "/v1/completions":
                return await _scripted(self.script, receive, send)
        await self.app(scope, receive, _unescaping(send) if self.raw_separators else send)


async def _scripted(
    script: Callable[[dict[str, Any]], AsyncIterator[bytes]], receive: Receive, send: Send
) -> None:
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            break
    await _streamed(script(json.loads(raw)), send, b"text/event-stream")


async def _streamed(
    body: AsyncIterator[bytes], send: Send, content_type: bytes = b"text/plain"
) -> None:
    headers = [(b"content-type", content_type)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    async for part in body:
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse(data: Any) -> bytes:
    """One server-sent event of `data` as JSON (a string as it is)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def chunk(token_ids: Sequence[int] = (), text: str = "", finish: str | None = None) -> bytes:
    """A completion chunk's event with one choice."""
    choice = {"index": 0, "text": text, "token_ids": list(token_ids), "finish_reason": finish}
    return sse({"object": "text_completion", "choices": [choice]})


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> bytes:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return sse({"object": "text_completion", "choices": [], "usage": usage})


def _unescaping(send: Send) -> Send:
    async def unescaped(message: Message) -> None:
        if message["type"] == "http.response.body":
            body = message.get("body", b"")
            for code in ("0085", "2028", "2029"):
                body = body.replace(f"\\u{code}".encode(), chr(int(code, 16)).encode())
            message = {**message, "body": body}
        await send(message)

    return unescaped


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    headers = [(b"content-type", content_type), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass
class Remote:
    url: str
    port: int
    engine: AsyncEngine
    gate: Gate
    http: httpx.AsyncClient

    async def metrics(self) -> dict[str, float]:
        text = (await self.http.get("/metrics")).text
        families = text_string_to_metric_families(text)
        return {sample.name: sample.value for family in families for sample in family.samples}


def sim_core(step_s: float = 0.0) -> LLMEngine:
    return simulated_core(step_s, NUM_BLOCKS, max_model_len=MAX_MODEL_LEN)


@asynccontextmanager
async def remote(step_s: float = 0.0, api_key: str | None = None) -> AsyncIterator[Remote]:
    """The engine's HTTP app on a listening socket, behind a Gate."""
    async with AsyncEngine(sim_core(step_s)) as engine:
        with listening_socket("127.0.0.1", 0) as listening:
            port = listening.getsockname()[1]
            url = f"http://127.0.0.1:{port}"
            gate = Gate(build_app(engine, MODEL, api_key=api_key))
            async with running_server(gate, listening), httpx.AsyncClient(base_url=url) as http:
                yield Remote(url, port, engine, gate, http)


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Remote]:
    marker = request.node.get_closest_marker("engine_step_s")
    async with remote(marker.args[0] if marker else 0.0) as running:
        yield running


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served model's tokenizer, as a local HF folder."""
    folder = tmp_path_factory.mktemp("tokenizer")
    byte_tokenizer().save_pretrained(folder)
    return folder


def settings(url: str, tokenizer: Path, **overrides: Any) -> BackendSettings:
    fields: dict[str, Any] = {
        "kind": "openai",
        "url": url,
        "model": MODEL,
        "tokenizer": tokenizer,
        "max_num_seqs": 8,
        "scrape_interval_s": SCRAPE_S,
        "health_interval_s": SCRAPE_S,
    }
    return BackendSettings(**(fields | overrides))


@asynccontextmanager
async def backend_on(
    url: str, tokenizer: Path, clock: Callable[[], float] | None = None, **overrides: Any
) -> AsyncIterator[OpenAIBackend]:
    kwargs = {} if clock is None else {"clock": clock}
    table = settings(url, tokenizer, **overrides)
    assert table.tokenizer is not None
    async with OpenAIBackend(table, load_tokenizer(table.tokenizer), **kwargs) as backend:
        yield backend


def make_call(call_id: str = "call-1", prompt_len: int = 20, **params: Any) -> BackendCall:
    sampling = SamplingParams(**({"max_tokens": 8} | params))
    return BackendCall(call_id=call_id, prompt_ids=list(range(1, prompt_len + 1)), params=sampling)


async def scraped_until(
    backend: OpenAIBackend, check: Callable[[], bool | Awaitable[bool]], timeout_s: float = 5.0
) -> None:
    """Wait, scrape by scrape and bounded, until `check()` holds."""
    with anyio.fail_after(timeout_s):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await backend.next_scrape()
