"""POST /v1/completions over one AsyncEngine: a request in, one engine request, tokens out.

Algorithm: validate the body (protocol.py; in a worker thread past INLINE_PARSE_BYTES), turn the
prompt into token ids (a string with the engine's tokenizer, in a worker thread, one at a time
past SHARED_TOKENIZE_CHARS), add one engine request under the caller's request_id, then either
stream its deltas as server-sent events (each with its text and, on request, its token ids; the
usage chunk and `[DONE]` last) or gather them into one response.
Invariant: the engine request lives no longer than its HTTP exchange: a client that goes away,
mid-stream or while a whole response is gathered, aborts it at once (its blocks are freed), and
a response that ends any other way (finished, failed, server shutdown) closes it too.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.async_engine import AsyncEngine, RequestStream, TokenDelta
from engine.openai_api.errors import (
    ApiError,
    BadRequest,
    EngineUnavailable,
    GenerationFailed,
    UnknownModel,
)
from engine.openai_api.metrics import EngineMetrics
from engine.openai_api.protocol import (
    SSE_DONE,
    Choice,
    Completion,
    CompletionRequest,
    ErrorBody,
    Usage,
    check_prompt,
    finish_reason,
    parse_request,
    sse,
)
from engine.request import FinishReason

# a body up to this size is parsed on the event loop (~0.2 ms at most), for less than a worker
# thread's hop costs (~0.15 ms of CPU); a gateway's call of 500 token ids is ~3 KB
INLINE_PARSE_BYTES = 16_384
# a longer string prompt is tokenized one at a time: the tokenizer takes up to ~800 bytes a
# character (an emoji is 4 byte tokens, each with its string, offsets and masks), and worker
# threads each on a 262,144-character prompt took 200 MB apiece, for prompts refused afterwards
# as past max_model_len (twenty at once: 4 GB); a shorter one takes ~13 MB at most
SHARED_TOKENIZE_CHARS = 16_384
Parsed = TypeVar("Parsed")


@dataclass(frozen=True, slots=True)
class Served:
    """What the server serves: one engine, under one model name, within its limits."""

    engine: AsyncEngine
    model_name: str
    tokenizer: Any  # a transformers tokenizer: string prompts in, text out
    vocab_size: int  # prompt token ids must be below it
    metrics: EngineMetrics
    max_prompt_chars: int  # a string prompt longer than this is refused before tokenizing
    # one large body parsed at a time: parsing holds the GIL (so more at once go no faster) and
    # each takes several times its body in memory
    parsing: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))
    # one long text tokenized at a time (SHARED_TOKENIZE_CHARS)
    tokenizing: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))

    @property
    def max_model_len(self) -> int:
        return self.engine.core.config.max_model_len


class EventStream(StreamingResponse):
    """Server-sent events over one engine request, closed however the response ends."""

    def __init__(self, events: AsyncGenerator[str, None], stream: RequestStream) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._events = events
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._events.aclose()
                await self._stream.aclose()  # aborts the engine request unless it finished


async def parsed(served: Served, parse: Callable[[bytes], Parsed], body: bytes) -> Parsed:
    """`parse(body)`: in a worker thread past INLINE_PARSE_BYTES (a body may hold megabytes of
    token ids: parsed on the event loop, every stream would stop), one at a time, else on the
    loop, where a call of a few hundred ids parses faster than a worker thread hands it back."""
    if len(body) <= INLINE_PARSE_BYTES:
        return parse(body)
    return await anyio.to_thread.run_sync(parse, body, limiter=served.parsing)


async def tokenized(served: Served, text: str, encode: Callable[[], Parsed]) -> Parsed:
    """`encode()`, the work of tokenizing `text`, in a worker thread: past SHARED_TOKENIZE_CHARS
    one at a time, so that memory holds one long text's tokens however many arrive at once."""
    long = len(text) > SHARED_TOKENIZE_CHARS
    return await anyio.to_thread.run_sync(encode, limiter=served.tokenizing if long else None)


async def create_completion(served: Served, http: HttpRequest, body: bytes) -> Response:
    request = await parsed(served, parse_request, body)
    if request.model is not None and request.model != served.model_name:
        raise UnknownModel(f"the model `{request.model}` does not exist", "model")
    prompt = await _prompt_ids(served, request)
    params = request.sampling_params(len(prompt), served.max_model_len)
    request_id = request.request_id or uuid.uuid4().hex
    stream = served.engine.add_request(
        prompt,
        params,
        request_id=request_id,
        priority=float(request.priority),
        cache_salt=request.cache_salt or "",
    )
    reply = _Reply(served, request, request_id, prompt)
    if request.stream:
        return EventStream(reply.events(stream), stream)
    async with stream:
        return await _unless_disconnected(http, reply.whole(stream))


async def _prompt_ids(served: Served, request: CompletionRequest) -> list[int]:
    if isinstance(request.prompt, str):
        if len(request.prompt) > served.max_prompt_chars:
            raise BadRequest(
                f"the prompt has {len(request.prompt)} characters; at most "
                f"{served.max_prompt_chars}",
                "prompt",
            )
        encode = functools.partial(served.tokenizer.encode, request.prompt)
        ids: list[int] = await tokenized(served, request.prompt, encode)
    else:
        ids = request.prompt
    check_prompt(ids, served.vocab_size, served.max_model_len)
    return ids


async def _unless_disconnected(http: HttpRequest, reply: Awaitable[Response]) -> Response:
    """Await `reply`, or stop (cancelling it) as soon as the client disconnects."""
    result: Response = Response(status_code=499)  # nobody reads it: the client is gone
    failure: Exception | None = None
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while (await http.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            result = await reply
        except Exception as exc:  # raised below, outside the task group, so not in a group
            failure = exc
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result


class _Reply:
    """The response side of one completion: chunks or a whole body, and the token counters."""

    def __init__(
        self, served: Served, request: CompletionRequest, request_id: str, prompt: list[int]
    ) -> None:
        self.served = served
        self.request = request
        self.id = f"cmpl-{request_id}"
        self.prompt = prompt
        self.created = int(time.time())
        self._prefilled = False

    async def events(self, stream: RequestStream) -> AsyncGenerator[str, None]:
        ids = self.request.return_token_ids
        first = True
        try:
            async for delta in stream:
                self._check(delta)
                self._count(delta)
                choice = Choice(
                    text=delta.text,
                    finish_reason=finish_reason(delta.finish_reason),
                    token_ids=delta.token_ids if ids else None,
                    prompt_token_ids=self.prompt if ids and first else None,
                )
                first = False
                yield sse(self._completion([choice]))
                if delta.finished and delta.request is not None and self.request.include_usage:
                    yield sse(self._completion([], Usage.of(delta.request)))
            if not stream.finished:
                raise EngineUnavailable("the engine shut down before the request finished")
        except ApiError as exc:
            yield sse(ErrorBody.of(exc.message, exc.type, exc.status, exc.param))
        yield SSE_DONE

    async def whole(self, stream: RequestStream) -> Response:
        text: list[str] = []
        token_ids: list[int] = []
        async for delta in stream:
            self._check(delta)
            self._count(delta)
            text.append(delta.text)
            token_ids += delta.token_ids
            if delta.finished and delta.request is not None:
                ids = self.request.return_token_ids
                choice = Choice(
                    text="".join(text),
                    finish_reason=finish_reason(delta.finish_reason),
                    token_ids=token_ids if ids else None,
                    prompt_token_ids=self.prompt if ids else None,
                )
                body = self._completion([choice], Usage.of(delta.request))
                return JSONResponse(body.model_dump(mode="json"))
        raise EngineUnavailable("the engine shut down before the request finished")

    def _check(self, delta: TokenDelta) -> None:
        if delta.finish_reason is FinishReason.ERROR:
            raise GenerationFailed("the engine failed while computing this request")

    def _count(self, delta: TokenDelta) -> None:
        if not delta.token_ids:
            return
        if not self._prefilled:
            self.served.metrics.prefilled(len(self.prompt))
            self._prefilled = True
        self.served.metrics.generated(len(delta.token_ids))

    def _completion(self, choices: list[Choice], usage: Usage | None = None) -> Completion:
        return Completion(
            id=self.id,
            created=self.created,
            model=self.served.model_name,
            choices=choices,
            usage=usage,
        )
