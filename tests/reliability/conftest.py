"""A real gateway on port 0 over the simulated engine, served from a thread of its own.

Property-based tests drive their examples synchronously, so the gateway runs on an event loop in
a background thread (an anyio blocking portal) and the tests talk to it through a plain
synchronous grpc channel: the same bytes on the wire as an aio client, and no event loop in the
test body. Tenants: `wide` has a generous quota, so most valid jobs are admitted; `narrow` takes
one queued job of at most 8 nodes and 2,000 tokens a day, so quota refusals happen too. Both
cap max_tokens low: the simulated engine makes exactly max_tokens tokens per call, and a cheap
call keeps a run short.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from anyio.from_thread import start_blocking_portal
from grpc_health.v1 import health_pb2_grpc

from fairgate.v1 import gateway_pb2_grpc
from gateway.server import RunningGateway, running_gateway
from gateway.settings import Settings
from tenants import MemoryQuotaStore, TenantQuota
from tests.gateway.conftest import ADMIN_KEY, sim_core
from tests.reliability.redis_server import RedisServer

QUOTAS = {
    "wide": TenantQuota(max_tokens_ceiling=16, default_max_tokens=4),
    "narrow": TenantQuota(
        max_queued_jobs=1,
        max_nodes_per_job=8,
        max_tokens_ceiling=8,
        default_max_tokens=4,
        daily_token_budget=2_000,
    ),
}


@dataclass
class ServedGateway:
    gateway: RunningGateway
    channel: grpc.Channel
    stub: gateway_pb2_grpc.GatewayStub
    health: health_pb2_grpc.HealthStub
    keys: dict[str, str]  # tenant id -> API key

    def auth(self, tenant: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {self.keys[tenant]}"),)


async def _store_with(quotas: Mapping[str, TenantQuota]) -> tuple[MemoryQuotaStore, dict[str, str]]:
    """Built on the gateway's loop: the store's locks belong to the loop that uses them."""
    store = MemoryQuotaStore()
    keys = {}
    for tenant, quota in quotas.items():
        await store.create_tenant(tenant, tenant.title(), quota)
        keys[tenant] = (await store.issue_key(tenant))[1]
    return store, keys


@contextlib.contextmanager
def served_gateway(quotas: Mapping[str, TenantQuota] = QUOTAS) -> Iterator[ServedGateway]:
    """Start a gateway in a background thread; yield it with a synchronous channel to it."""
    settings = Settings(port=0, admin_key=ADMIN_KEY, policy="justitia", max_model_len=4096)
    with start_blocking_portal(backend="asyncio") as portal:
        store, keys = portal.call(_store_with, quotas)
        serving = running_gateway(settings, core=sim_core(), store=store)
        with (
            portal.wrap_async_context_manager(serving) as gateway,
            grpc.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
        ):
            stub = gateway_pb2_grpc.GatewayStub(channel)
            yield ServedGateway(gateway, channel, stub, health_pb2_grpc.HealthStub(channel), keys)


@pytest.fixture(scope="module")
def served() -> Iterator[ServedGateway]:
    """One gateway for a whole module: property tests send it thousands of requests."""
    with served_gateway() as gateway:
        yield gateway


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (AOF on), stopped afterwards."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
