"""A TCP proxy a test can cut or freeze: as when a server dies, or its host goes silent.

Connections are forwarded byte for byte to the upstream address. `cut()` closes the listener
and every open connection, so clients see a dropped stream and then a refused connection.
`freeze()` forwards nothing more either way and closes nothing, as a lost host or a network cut
does: only a client's own timeout or keepalive can tell; `thaw()` lets connections made after
it through again (those frozen stay so), and `connection()` returns once the next is accepted.
`lose_reply_to(marker)` lets the next request holding `marker` through but drops its connection
instead of its reply: the upstream acted on it, the client never heard (`replies_lost` counts them);
with `times`, so many such requests one after another (a client's retry losing its reply too).
`break_replies_to(marker)` lets each reply to a request holding `marker` through up to its first
whole server-sent event, then drops the connection: a server that fails every such call once it has
begun to stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from anyio.abc import ByteStream, SocketStream, TaskGroup


class CuttableProxy:
    def __init__(self, tg: TaskGroup, upstream_port: int) -> None:
        self._tg = tg
        self._upstream_port = upstream_port
        self._scope = anyio.CancelScope()
        self._frozen = anyio.Event()
        self._accepted = anyio.Event()
        self._lose_reply_to: bytes | None = None
        self._losses_left = 0
        self.replies_lost = 0
        self._break_replies_to: bytes | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self._tg.start_soon(self._serve, listener)

    async def _serve(self, listener: anyio.abc.Listener[SocketStream]) -> None:
        with self._scope:
            async with listener, anyio.create_task_group() as tg:
                await listener.serve(self._forward, tg)

    async def _forward(self, client: SocketStream) -> None:
        accepted, self._accepted = self._accepted, anyio.Event()
        accepted.set()
        async with client:
            upstream = await anyio.connect_tcp("127.0.0.1", self._upstream_port)
            losing = anyio.Event()  # a request whose reply is to be lost went up
            breaking = anyio.Event()  # a request whose reply is to break went up
            replied = bytearray()  # of a reply to break, what was forwarded

            def request(chunk: bytes) -> bool:
                if self._lose_reply_to is not None and self._lose_reply_to in chunk:
                    self._losses_left -= 1
                    if not self._losses_left:
                        self._lose_reply_to = None
                    losing.set()
                if self._break_replies_to is not None and self._break_replies_to in chunk:
                    breaking.set()
                return True

            def reply(chunk: bytes) -> bool:
                self.replies_lost += losing.is_set()
                if breaking.is_set():
                    event = replied.find(b"data:")
                    if event >= 0 and b"\n\n" in replied[event:]:
                        return False
                    replied.extend(chunk)
                return not losing.is_set()

            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(_pump, client, upstream, tg, self._frozen, request)
                tg.start_soon(_pump, upstream, client, tg, self._frozen, reply)

    def cut(self) -> None:
        self._scope.cancel()

    def freeze(self) -> None:
        self._frozen.set()

    def thaw(self) -> None:
        self._frozen = anyio.Event()

    async def connection(self) -> None:
        await self._accepted.wait()

    def lose_reply_to(self, marker: bytes, times: int = 1) -> None:
        self._lose_reply_to, self._losses_left = marker, times

    def break_replies_to(self, marker: bytes) -> None:
        self._break_replies_to = marker


async def _pump(
    source: ByteStream,
    sink: ByteStream,
    tg: TaskGroup,
    frozen: anyio.Event,
    forwards: Callable[[bytes], bool],
) -> None:
    try:
        async for chunk in source:
            if frozen.is_set():
                await anyio.sleep_forever()  # read no more: the sender's buffers fill, unacked
            if not forwards(chunk):
                break
            await sink.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    tg.cancel_scope.cancel()  # one side ended: so does the connection


@asynccontextmanager
async def cuttable_proxy(upstream_port: int) -> AsyncIterator[CuttableProxy]:
    async with anyio.create_task_group() as tg:
        proxy = CuttableProxy(tg, upstream_port)
        await proxy.start()
        try:
            yield proxy
        finally:
            proxy.cut()
