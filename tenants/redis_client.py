"""What every Redis user of fairgate shares: a bounded client that stays closed, and Redis
failures that fail closed.

`RedisClient` owns one client (bounded connections, waits and retries: one retry on a dropped
connection, as every script is idempotent). Once closed it refuses every call, because redis-py
would quietly open a new connection for a task still running after the close (a gRPC handler
that outlives its server's stop), and nothing would ever close that one. For the same reason
closing waits (a bounded while) for the calls under way: a call whose connection the close cut
would reconnect to retry, and put that connection back in a pool nobody closes again.
`fails_closed(error, what)` guards its methods: a closed client, or any Redis error, becomes
`error("<what> unavailable")`. That message reaches clients, unauthenticated ones included, so
it names no host or port; the detail is logged here, with its traceback once per `LOG_EVERY_S`
for each guarded method of a client (and how many failed meanwhile): while Redis is away every
reserve and its retries fail, and a traceback each wrote thousands of lines a second.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

import anyio
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

_log = logging.getLogger(__name__)
LOG_EVERY_S = 10.0
_P = ParamSpec("_P")
_T = TypeVar("_T")
_C = TypeVar("_C", bound="RedisClient")


class _CountedPool(BlockingConnectionPool):
    """Counts the requests sent: redis-py takes a connection from its pool once per command
    and once per pipeline, so each is one round trip (`round_trips`, for the replicas
    benchmark's Redis round trips per call)."""

    taken = 0

    async def get_connection(self, *args: Any, **options: Any) -> Any:
        _CountedPool.taken += 1
        return await super().get_connection(*args, **options)  # type: ignore[no-untyped-call]


def round_trips() -> int:
    """Redis round trips this process's clients have made so far."""
    return _CountedPool.taken


def bounded_client(url: str, pool_size: int, timeout_s: float, pool_timeout_s: float) -> Redis:
    """A client of at most `pool_size` connections; a call waits `pool_timeout_s` for one."""
    pool = _CountedPool.from_url(
        url,
        max_connections=pool_size,
        timeout=pool_timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), retries=1),
        decode_responses=True,
    )
    return Redis.from_pool(pool)


class RedisClient:
    def __init__(self, url: str, pool_size: int, timeout_s: float, pool_timeout_s: float) -> None:
        self._redis = bounded_client(url, pool_size, timeout_s, pool_timeout_s)
        self.closed = False
        # a call waits for the pool at most pool_timeout_s, then is sent at most twice
        self._close_wait_s = pool_timeout_s + 2 * timeout_s
        self._under_way = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._failures = FailureLog()  # its guarded methods' (`fails_closed`)

    async def aclose(self) -> None:
        self.closed = True
        with anyio.move_on_after(self._close_wait_s, shield=True):
            await self._idle.wait()
        await self._redis.aclose()

    def _started(self) -> None:
        if self._under_way == 0:
            self._idle = anyio.Event()
        self._under_way += 1

    def _ended(self) -> None:
        self._under_way -= 1
        if self._under_way == 0:
            self._idle.set()


class FailureLog:
    """Logs a kind of failure with its traceback at most once per `every_s`, with the number
    of the same failures since the last line."""

    def __init__(self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.every_s, self.clock = every_s, clock
        self._last: dict[str, tuple[float, int]] = {}  # kind -> (when logged, failed since)

    def failed(self, kind: str, exc: BaseException) -> None:
        now = self.clock()
        logged_at, since = self._last.get(kind, (-math.inf, 0))
        if now - logged_at < self.every_s:
            self._last[kind] = (logged_at, since + 1)
            return
        self._last[kind] = (now, 0)
        more = f" ({since} more since the last line)" if since else ""
        _log.warning("%s%s", kind, more, exc_info=exc)


def fails_closed(
    error: Callable[[str], Exception], what: str
) -> Callable[
    [Callable[Concatenate[_C, _P], Awaitable[_T]]],
    Callable[Concatenate[_C, _P], Coroutine[Any, Any, _T]],
]:
    def decorate(
        method: Callable[Concatenate[_C, _P], Awaitable[_T]],
    ) -> Callable[Concatenate[_C, _P], Coroutine[Any, Any, _T]]:
        @functools.wraps(method)
        async def translated(self: _C, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
            if self.closed:
                raise error(f"{what} unavailable")
            self._started()
            try:
                return await method(self, *args, **kwargs)
            except RedisError as exc:
                self._failures.failed(f"{what} unavailable in {method.__name__}", exc)
                raise error(f"{what} unavailable") from exc
            finally:
                self._ended()

        return translated

    return decorate
