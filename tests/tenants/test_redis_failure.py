"""When Redis is unreachable, slow or restarted, the quota store fails closed, then recovers.

Every operation raises QuotaUnavailable (the gateway answers UNAVAILABLE) within about two
socket timeouts: one try and one retry. Quota operations are idempotent by call or job id, so
the retry never charges twice. Scripts survive a SCRIPT FLUSH (EVALSHA reloads on NOSCRIPT) and
the store reconnects by itself once Redis is back.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest
from redis import Redis as SyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from tenants import (
    QuotaUnavailable,
    RedisQuotaStore,
    TenantExists,
    TenantNotFound,
    TenantQuota,
)
from tenants.redis_client import FailureLog
from tests.conftest import REDIS_URL
from tests.fake_clock import FakeClock
from tests.gateway.backends.proxy import cuttable_proxy

pytestmark = pytest.mark.anyio

TIMEOUT_S = 0.2
KEY = "fg_0123456789abcdef_" + "a" * 43

Op = Callable[[RedisQuotaStore], Awaitable[object]]
OPERATIONS: dict[str, Op] = {
    "create_tenant": lambda s: s.create_tenant("acme", "Acme", TenantQuota()),
    "get_tenant": lambda s: s.get_tenant("acme"),
    "list_tenants": lambda s: s.list_tenants(),
    "update_tenant": lambda s: s.update_tenant("acme", display_name="A"),
    "delete_tenant": lambda s: s.delete_tenant("acme"),
    "issue_key": lambda s: s.issue_key("acme"),
    "list_keys": lambda s: s.list_keys("acme"),
    "revoke_key": lambda s: s.revoke_key("acme", "0123456789abcdef"),
    "authenticate": lambda s: s.authenticate(KEY),
    "admit_job": lambda s: s.admit_job("acme", "j1", 1),
    "admit_job_and_reserve": lambda s: s.admit_job_and_reserve("acme", "j1", 1, "c1", 10, 30.0),
    "finish_job": lambda s: s.finish_job("acme", "j1"),
    "reserve": lambda s: s.reserve("acme", "c1", 10, 30.0),
    "settle": lambda s: s.settle("acme", "c1", 1, 1),
    "release": lambda s: s.release("acme", "c1"),
    "renew": lambda s: s.renew("acme", calls=["c1"], jobs=["j1"], ttl_s=30.0),
    "usage": lambda s: s.usage("acme"),
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def assert_fails_closed(store: RedisQuotaStore, op: Op, within_s: float) -> None:
    started = time.monotonic()
    with pytest.raises(QuotaUnavailable):
        await op(store)
    assert time.monotonic() - started < within_s


@pytest.mark.parametrize("name", sorted(OPERATIONS))
async def test_closed_port_fails_closed_promptly(name: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    async with RedisQuotaStore(url, socket_timeout_s=TIMEOUT_S) as store:
        await assert_fails_closed(store, OPERATIONS[name], within_s=1.0)


async def test_unavailable_tells_callers_nothing_of_the_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The message reaches unauthenticated clients: no host, port or Redis text; the log has it."""
    port = free_port()
    async with RedisQuotaStore(f"redis://127.0.0.1:{port}/0", socket_timeout_s=TIMEOUT_S) as store:
        with (
            caplog.at_level(logging.WARNING, logger="tenants.redis_store"),
            pytest.raises(QuotaUnavailable) as caught,
        ):
            await store.authenticate(KEY)
    assert str(caught.value) == "quota store unavailable"
    assert isinstance(caught.value.__cause__, RedisError)
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is not None
    assert str(port) in caplog.text


async def test_silent_server_times_out() -> None:
    """A server that accepts connections and never answers (a hung Redis)."""
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, _swallow)
            async with RedisQuotaStore(
                f"redis://127.0.0.1:{port}/0", socket_timeout_s=TIMEOUT_S
            ) as store:
                await assert_fails_closed(store, OPERATIONS["reserve"], within_s=4 * TIMEOUT_S)
            tg.cancel_scope.cancel()


async def _swallow(stream: anyio.abc.SocketStream) -> None:
    async with stream:
        async for _ in stream:
            pass


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


@pytest.mark.redis
async def test_scripts_reload_after_script_flush(private_redis: PrivateRedis) -> None:
    async with RedisQuotaStore(private_redis.url) as store:
        await store.create_tenant("acme", "Acme", TenantQuota(max_concurrent_calls=4))
        await store.reserve("acme", "c1", 10, 30.0)
        private_redis.flush_scripts()
        await store.reserve("acme", "c2", 10, 30.0)
        assert await store.settle("acme", "c1", 5, 5) is True
        assert (await store.usage("acme")).active_reservations == 1


@pytest.mark.redis
async def test_outage_fails_closed_then_recovers(private_redis: PrivateRedis) -> None:
    async with RedisQuotaStore(private_redis.url, socket_timeout_s=TIMEOUT_S) as store:
        await store.create_tenant("acme", "Acme", TenantQuota(max_concurrent_calls=4))
        await store.reserve("acme", "c1", 10, 30.0)
        private_redis.stop()
        for name in ("reserve", "settle", "usage"):
            await assert_fails_closed(store, OPERATIONS[name], within_s=1.0)
        private_redis.start()
        usage = await store.usage("acme")
        assert (usage.active_reservations, usage.reserved_tokens) == (1, 10)
        assert await store.settle("acme", "c1", 4, 6) is True
        assert (await store.usage("acme")).tokens_today == 10


async def test_a_tenant_change_whose_reply_was_lost_is_answered_as_it_ran(
    redis_prefix: str,
) -> None:
    """The client sends a script once more when its connection drops: a creation that ran, its
    reply lost, was answered "already exists" by its retry, and a deletion "not found"."""
    redis = urlsplit(REDIS_URL)
    async with cuttable_proxy(redis.port or 6379) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}{redis.path}"
        async with RedisQuotaStore(url, prefix=redis_prefix) as store:
            await store.create_tenant("warm", "Warm", TenantQuota())  # the scripts loaded
            await store.delete_tenant("warm")
            proxy.lose_reply_to(b"acme")
            created = await store.create_tenant("acme", "Acme", TenantQuota())
            assert proxy.replies_lost == 1
            assert created == await store.get_tenant("acme")
            with pytest.raises(TenantExists):  # another creation is refused as ever
                await store.create_tenant("acme", "Acme", TenantQuota())
            proxy.lose_reply_to(b"acme")
            await store.delete_tenant("acme")
            assert proxy.replies_lost == 2
            with pytest.raises(TenantNotFound):
                await store.delete_tenant("acme")


def test_a_failure_is_logged_with_its_traceback_once_an_interval_with_the_count_since(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While Redis was away every reserve and its retries logged a traceback: a 6 s outage of a
    live gateway wrote 15,000 lines."""
    clock = FakeClock()
    failures = FailureLog(every_s=10.0, clock=clock)
    error = RedisConnectionError("connection refused")
    with caplog.at_level(logging.WARNING, logger="tenants.redis_client"):
        for _ in range(500):  # 15 s of a failure every 30 ms
            failures.failed("quota store unavailable in reserve", error)
            clock.advance(0.03)
        failures.failed("quota store unavailable in settle", error)  # another kind: its own
    lines = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert lines == [
        ("quota store unavailable in reserve", True),
        ("quota store unavailable in reserve (333 more since the last line)", True),
        ("quota store unavailable in settle", True),
    ]


async def test_a_store_that_cannot_reach_redis_logs_one_traceback_not_one_a_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with RedisQuotaStore(
        f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=TIMEOUT_S
    ) as store:
        with caplog.at_level(logging.WARNING, logger="tenants.redis_client"):
            for _ in range(20):
                with pytest.raises(QuotaUnavailable):
                    await store.usage("acme")
    [record] = [r for r in caplog.records if r.name == "tenants.redis_client"]
    assert record.getMessage() == "quota store unavailable in usage" and record.exc_info
