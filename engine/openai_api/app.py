"""The OpenAI-compatible HTTP face of one AsyncEngine: a starlette app with vLLM's routes.

Routes: POST /v1/completions (completions.py), GET /v1/models (the served model and its
max_model_len), POST /tokenize (tokenize.py), GET /health (200 while the engine is healthy, 503
otherwise), GET /metrics (Prometheus text, metrics.py). Errors are translated here, once: this
server's own (errors.py), the engine's (InvalidRequest 400, DuplicateRequest 409, EngineClosed
503) and starlette's (an unknown route 404, a wrong method 405) all become one OpenAI-style
body, `{"error": {"message", "type", "param", "code"}}`.
With an `api_key`, the routes that run the model (/v1/completions, /tokenize, /v1/models) answer
only a request with `Authorization: Bearer <key>` (401 otherwise, as vLLM's `--api-key` does);
/health and /metrics stay open, for probes and scrapers.
Invariant: a request body is read only while its declared and received length stay within
`max_body_bytes`, and a keyed route's key is checked before its body is read; past the limit
the request is refused (413) before anything parses it.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.async_engine import AsyncEngine
from engine.errors import DuplicateRequest, EngineClosed, InvalidRequest
from engine.openai_api.completions import Served, create_completion
from engine.openai_api.errors import (
    ApiError,
    BadRequest,
    BodyTooLarge,
    EngineUnavailable,
    RequestIdInUse,
    Unauthorized,
)
from engine.openai_api.metrics import EngineMetrics
from engine.openai_api.protocol import ErrorBody, ModelCard, ModelList
from engine.openai_api.tokenize import tokenize

MAX_BODY_BYTES = 16 << 20
MAX_PROMPT_CHARS = 262_144  # a string prompt, before it is tokenized


def build_app(
    engine: AsyncEngine,
    model_name: str,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
    api_key: str | None = None,
) -> Starlette:
    """The app over a running engine (the caller owns the engine's lifetime)."""
    keyed = _keyed(api_key)
    tokenizer = engine.core.tokenizer
    if tokenizer is None:
        raise ValueError("serving completions needs an engine with a tokenizer")
    served = Served(
        engine=engine,
        model_name=model_name,
        tokenizer=tokenizer,
        # an id past the model's rows would fail the whole step, every request in it
        vocab_size=min(len(tokenizer), engine.core.runner.vocab_size),
        metrics=EngineMetrics(engine, model_name),
        max_prompt_chars=max_prompt_chars,
    )
    card = ModelCard(
        id=model_name, created=int(time.time()), root=model_name, max_model_len=served.max_model_len
    )

    async def completions(request: Request) -> Response:
        return await create_completion(served, request, await _body(request, max_body_bytes))

    async def tokenize_text(request: Request) -> Response:
        return await tokenize(served, await _body(request, max_body_bytes))

    async def models(_: Request) -> Response:
        return JSONResponse(ModelList(data=[card]).model_dump(mode="json"))

    async def health(_: Request) -> Response:
        return Response(status_code=200 if engine.healthy else 503)

    async def metrics(_: Request) -> Response:
        return Response(served.metrics.render(), media_type=served.metrics.content_type)

    return Starlette(
        routes=[
            Route("/v1/completions", keyed(completions), methods=["POST"]),
            Route("/v1/models", keyed(models), methods=["GET"]),
            Route("/tokenize", keyed(tokenize_text), methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers={
            ApiError: _error_response,
            InvalidRequest: _error_response,
            EngineClosed: _error_response,
            HTTPException: _error_response,
            ClientDisconnect: _client_gone,
        },
    )


Handler = Callable[[Request], Awaitable[Response]]


def _keyed(api_key: str | None) -> Callable[[Handler], Handler]:
    """Wrap a route's handler to answer only requests bearing `api_key` (every one without)."""
    if api_key is None:
        return lambda handler: handler
    expected = f"Bearer {api_key}".encode()

    def keyed(handler: Handler) -> Handler:
        async def checked(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode("latin-1")
            if not hmac.compare_digest(given, expected):
                raise Unauthorized("a valid API key is needed (Authorization: Bearer <key>)")
            return await handler(request)

        return checked

    return keyed


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "0")
    if not declared.isdigit():
        raise BadRequest("the Content-Length header is not a number")
    if int(declared) > limit:
        raise BodyTooLarge(f"the request body is {declared} bytes; at most {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _client_gone(_: Request, exc: Exception) -> Response:
    """The client closed the connection before its request was read: nothing was started and
    nobody reads the answer (not a server error)."""
    return Response(status_code=HTTPStatus.BAD_REQUEST)


def _error_response(_: Request, exc: Exception) -> Response:
    error = _api_error(exc)
    body = ErrorBody.of(error.message, error.type, error.status, error.param)
    return JSONResponse(body.model_dump(mode="json"), status_code=error.status)


def _api_error(exc: Exception) -> ApiError:
    """The one mapping from what was raised to what the client is told."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, DuplicateRequest):
        return RequestIdInUse(str(exc), "request_id")
    if isinstance(exc, InvalidRequest):
        return BadRequest(str(exc))
    if isinstance(exc, EngineClosed):
        return EngineUnavailable(str(exc))
    if isinstance(exc, HTTPException):  # starlette's routing: no such route, wrong method
        error = ApiError(exc.detail)
        error.status = exc.status_code
        error.type = HTTPStatus(exc.status_code).phrase.replace(" ", "") + "Error"
        return error
    raise TypeError(f"no error mapping for {type(exc).__name__}")
