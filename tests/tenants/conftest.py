"""Quota store fixtures: each contract test runs on the in-memory twin and on a real Redis.

The Redis side uses the redis-server on 127.0.0.1:6379 (scripts/test.sh starts one) with a
unique key prefix per test, deleted afterwards; a test that stops Redis or flushes its scripts
gets a private redis-server instead (`private_redis`).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis import Redis as SyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError

from tenants import MemoryQuotaStore, QuotaStore, RedisQuotaStore

REDIS_URL = "redis://127.0.0.1:6379/0"
START = 1_750_000_000.0 + 6 * 3600  # 06:00 UTC, far from a budget day boundary


class FakeClock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A unique key prefix on the local Redis, cleaned up after the test."""
    client = SyncRedis.from_url(REDIS_URL, socket_timeout=2.0)
    try:
        client.ping()
    except RedisConnectionError:
        client.close()
        pytest.skip("no redis-server on 127.0.0.1:6379 (scripts/test.sh starts one)")
    prefix = f"fgtest-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        stale = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if stale:
            client.delete(*stale)
        client.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "memory":
        clock = FakeClock()
        async with MemoryQuotaStore(clock=clock) as memory_store:
            yield Harness(memory_store, clock)
    else:
        prefix = request.getfixturevalue("redis_prefix")
        async with RedisQuotaStore(REDIS_URL, prefix=prefix) as redis_store:
            yield Harness(redis_store, None)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateRedis:
    """A redis-server of our own (AOF on, in tmp_path) that a test may stop and restart."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._directory = directory
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        options = {"port": str(self.port), "bind": "127.0.0.1", "save": "", "appendonly": "yes"}
        options |= {"appendfsync": "always", "dir": str(self._directory)}
        argv = [item for name, value in options.items() for item in (f"--{name}", value)]
        self._process = subprocess.Popen(["redis-server", *argv], stdout=subprocess.DEVNULL)
        client = SyncRedis.from_url(self.url, socket_timeout=1.0)
        deadline = time.monotonic() + 10.0
        while True:
            try:
                client.ping()
                break
            except RedisConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)  # waiting for a process to boot, not driving policy
        client.close()

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def flush_scripts(self) -> None:
        with SyncRedis.from_url(self.url) as client:
            client.script_flush()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
