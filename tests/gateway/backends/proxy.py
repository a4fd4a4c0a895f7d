"""A TCP proxy a test can cut or freeze: as when a server dies, or its host goes silent.

Connections are forwarded byte for byte to the upstream address. `cut()` closes the listener
and every open connection, so clients see a dropped stream and then a refused connection.
`freeze()` forwards nothing more either way and closes nothing, as a lost host or a network cut
does: only a client's own timeout or keepalive can tell.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.abc import ByteStream, SocketStream, TaskGroup


class CuttableProxy:
    def __init__(self, tg: TaskGroup, upstream_port: int) -> None:
        self._tg = tg
        self._upstream_port = upstream_port
        self._scope = anyio.CancelScope()
        self._frozen = anyio.Event()
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
        async with client:
            upstream = await anyio.connect_tcp("127.0.0.1", self._upstream_port)
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(_pump, client, upstream, tg, self._frozen)
                tg.start_soon(_pump, upstream, client, tg, self._frozen)

    def cut(self) -> None:
        self._scope.cancel()

    def freeze(self) -> None:
        self._frozen.set()


async def _pump(source: ByteStream, sink: ByteStream, tg: TaskGroup, frozen: anyio.Event) -> None:
    try:
        async for chunk in source:
            if frozen.is_set():
                await anyio.sleep_forever()  # read no more: the sender's buffers fill, unacked
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
