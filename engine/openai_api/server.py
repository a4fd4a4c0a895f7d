"""Running the app: uvicorn on a socket that is listening before anyone is told its port.

`listening_socket` binds and listens first, so the moment its address is printed (or handed to
a test) connections are accepted into the backlog, and uvicorn serves them once it starts: no
waiting on a "started" flag. `running_server` owns uvicorn's task for the span of a `with`
block; `serve` runs one engine behind it until SIGINT or SIGTERM. Signals are ours, not
uvicorn's, so a shutdown returns normally instead of re-raising the signal.
Invariant: the engine outlives the server: requests in flight end (or are cut after `grace_s`)
before the engine closes and aborts whatever is left.
"""

from __future__ import annotations

import contextlib
import math
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import uvicorn
from starlette.types import ASGIApp

from engine.async_engine import AsyncEngine
from engine.heap import freeze_startup_heap
from engine.llm import LLMEngine
from engine.openai_api.app import MAX_BODY_BYTES, MAX_PROMPT_CHARS, build_app

BACKLOG = 2048
KEEP_ALIVE_S = 30  # how long an idle client connection stays open


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), port 0 for any free one, already listening. An IPv6
    host may come bracketed, as in a URL or a gRPC target (`[::1]`)."""
    host = host.removeprefix("[").removesuffix("]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: a response's head and body leave in two writes, and
    # with Nagle's algorithm the body would wait for the client's delayed ACK (40 ms)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the caller handles signals (see `serve`)


@contextlib.asynccontextmanager
async def running_server(
    app: ASGIApp, sock: socket.socket, grace_s: float = 5.0
) -> AsyncIterator[None]:
    """Serve `app` on `sock` while the block runs; on leaving, stop and wait for uvicorn."""
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        backlog=BACKLOG,
        timeout_graceful_shutdown=math.ceil(grace_s),
        # idle connections outlive a client pool's (httpx keeps one 5 s): the client closes
        # them first, else a request sent as the server closes its connection fails unread
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = _Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        try:
            yield
        finally:
            server.should_exit = True


async def serve(
    core: LLMEngine,
    model_name: str,
    host: str,
    port: int,
    *,
    on_listening: Callable[[str, int], None],
    grace_s: float = 5.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
    api_key: str | None = None,
) -> None:
    """Serve `core` under `model_name` until SIGINT or SIGTERM; `on_listening(host, port)` is
    called once connections are accepted."""
    async with AsyncEngine(core) as engine:
        app = build_app(
            engine,
            model_name,
            max_body_bytes=max_body_bytes,
            max_prompt_chars=max_prompt_chars,
            api_key=api_key,
        )
        with (
            anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
            listening_socket(host, port) as sock,
        ):
            async with running_server(app, sock, grace_s):
                freeze_startup_heap()
                on_listening(host, sock.getsockname()[1])
                async for _ in signals:
                    return
