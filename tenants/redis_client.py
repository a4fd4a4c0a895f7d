"""What every Redis user of fairgate shares: a bounded client, and Redis failures fail closed.

`redis_client` bounds connections, waits and retries (one retry on a dropped connection: every
script is idempotent). `fails_closed(error, what)` turns every Redis error of a method into
`error("<what> unavailable")`: that message reaches clients, unauthenticated ones included, so
it names no host or port; the detail is logged here.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

_log = logging.getLogger(__name__)
_P = ParamSpec("_P")
_T = TypeVar("_T")


def redis_client(url: str, pool_size: int, timeout_s: float, pool_timeout_s: float) -> Redis:
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=pool_size,
        timeout=pool_timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), retries=1),
        decode_responses=True,
    )
    return Redis.from_pool(pool)


def fails_closed(
    error: Callable[[str], Exception], what: str
) -> Callable[[Callable[_P, Awaitable[_T]]], Callable[_P, Coroutine[Any, Any, _T]]]:
    def decorate(method: Callable[_P, Awaitable[_T]]) -> Callable[_P, Coroutine[Any, Any, _T]]:
        @functools.wraps(method)
        async def translated(*args: _P.args, **kwargs: _P.kwargs) -> _T:
            try:
                return await method(*args, **kwargs)
            except RedisError as exc:
                _log.warning("%s unavailable in %s", what, method.__name__, exc_info=exc)
                raise error(f"{what} unavailable") from exc

        return translated

    return decorate
