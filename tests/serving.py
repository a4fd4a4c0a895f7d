"""A real grpc.aio server on an ephemeral port for tests: auth interceptor plus given services."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc

from gateway.auth import AuthInterceptor
from tenants import MemoryQuotaStore, QuotaStore

ADMIN_KEY = "fgadmin_test-admin-key"
AddService = Callable[[grpc.aio.Server], None]


@asynccontextmanager
async def serving(store: QuotaStore, *services: AddService) -> AsyncIterator[str]:
    """Serve `services` (each adds a servicer to the server) on 127.0.0.1, port 0; yields the
    target. Callers authenticate with ADMIN_KEY or a tenant key issued by `store`."""
    server = grpc.aio.server(interceptors=[AuthInterceptor(store, ADMIN_KEY)])
    for add in services:
        add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


class CountingStore(MemoryQuotaStore):
    """The memory store, counting the keys it is asked to check."""

    def __init__(self) -> None:
        super().__init__()
        self.authentications = 0

    async def authenticate(self, plaintext: str) -> str:
        self.authentications += 1
        return await super().authenticate(plaintext)
