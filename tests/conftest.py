"""Fixtures every test directory shares: the anyio backend, and keys on the local Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from redis import Redis as SyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.event_loop import TestEventLoop

REDIS_URL = "redis://127.0.0.1:6379/0"  # the local redis-server (scripts/test.sh starts one)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return "asyncio", {"loop_factory": TestEventLoop}


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
