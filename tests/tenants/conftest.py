"""Quota store fixtures: each contract test runs on the in-memory twin and on a real Redis.

The Redis side uses the redis-server on 127.0.0.1:6379 (scripts/test.sh starts one) with a
unique key prefix per test, deleted afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from tenants import MemoryQuotaStore, QuotaStore, RedisQuotaStore, TenantQuota
from tests.conftest import REDIS_URL
from tests.fake_clock import FakeClock

START = 1_750_000_000.0 + 6 * 3600  # 06:00 UTC, far from a budget day boundary
TTL = 60.0  # a reservation TTL no test outlives


@dataclass
class Harness:
    """A store and a way to let time pass: the memory store's clock moves by hand; on Redis
    real time passes by itself between calls, so tests read elapsed time from `Usage.as_of`."""

    store: QuotaStore
    clock: FakeClock | None

    @property
    def is_redis(self) -> bool:
        return self.clock is None

    @property
    def tiny_ttl_s(self) -> float:
        """A TTL that has run out by the next call: one clock step on memory, 1 us on Redis
        (any later script's TIME is at least one round trip later)."""
        return 1.0 if self.clock is not None else 1e-6

    def advance(self, seconds: float) -> None:
        if self.clock is not None:
            self.clock.advance(seconds)

    def need_clock(self, why: str) -> FakeClock:
        if self.clock is None:
            pytest.skip(f"needs a hand-driven clock: {why}")
        return self.clock


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "memory":
        clock = FakeClock(START)
        async with MemoryQuotaStore(clock=clock) as memory_store:
            yield Harness(memory_store, clock)
    else:
        prefix = request.getfixturevalue("redis_prefix")
        async with RedisQuotaStore(REDIS_URL, prefix=prefix) as redis_store:
            yield Harness(redis_store, None)


@pytest.fixture
def h(harness: Harness) -> Harness:
    return harness


async def make_tenant(h: Harness, tenant_id: str = "acme", **quota: int) -> None:
    await h.store.create_tenant(tenant_id, tenant_id.title(), TenantQuota(**quota))
