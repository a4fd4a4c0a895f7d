"""ScriptBatcher against a real Redis: one round trip per turn, each caller its own reply."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tenants.redis_batch import ScriptBatcher
from tests.tenants.conftest import REDIS_URL, PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
COUNT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
FAIL_ON_NEGATIVE = "if tonumber(ARGV[1]) < 0 then return redis.error_reply('negative') end " + COUNT


@dataclass
class Counted:
    redis: Redis
    checkouts: int = 0  # connections taken from the pool: one per round trip


@pytest.fixture
async def counted(redis_prefix: str) -> AsyncIterator[Counted]:
    counted = Counted(Redis.from_url(REDIS_URL, decode_responses=True))
    pool = counted.redis.connection_pool
    get_connection = pool.get_connection

    async def counting(*args: Any, **kwargs: Any) -> Any:
        counted.checkouts += 1
        return await get_connection(*args, **kwargs)

    pool.get_connection = counting  # type: ignore[method-assign]
    yield counted
    await counted.redis.aclose()


async def test_one_turns_scripts_share_one_round_trip_and_keep_their_replies(
    counted: Counted, redis_prefix: str
) -> None:
    redis = counted.redis
    batcher = ScriptBatcher(redis)
    script = redis.register_script(FAIL_ON_NEGATIVE)
    key = f"{redis_prefix}:n"
    replies: dict[int, Any] = {}

    async def add(amount: int) -> None:
        try:
            replies[amount] = await batcher.run(script, [key], [amount])
        except ResponseError as exc:
            replies[amount] = str(exc)

    await batcher.run(script, [key], [0])  # loads the script
    before = counted.checkouts
    async with anyio.create_task_group() as tg:
        for amount in (1, 2, -1, 4):
            tg.start_soon(add, amount)
    assert counted.checkouts - before == 1
    assert replies == {1: 1, 2: 3, -1: "negative", 4: 7}  # in order, the error to its caller


async def test_a_flushed_script_is_loaded_again_within_a_batch(
    private_redis: PrivateRedis,
) -> None:
    redis = Redis.from_url(private_redis.url, decode_responses=True)
    batcher = ScriptBatcher(redis)
    script = redis.register_script(COUNT)
    await batcher.run(script, ["n"], [1])
    private_redis.flush_scripts()
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(batcher.run, script, ["n"], [1])
    assert await redis.get("n") == "4"
    await redis.aclose()


async def test_a_caller_cancelled_before_the_send_is_left_out(
    counted: Counted, redis_prefix: str
) -> None:
    redis = counted.redis
    batcher = ScriptBatcher(redis)
    script = redis.register_script(COUNT)
    key = f"{redis_prefix}:n"
    await batcher.run(script, [key], [0])
    followers: list[int] = []

    async def follow() -> None:
        followers.append(await batcher.run(script, [key], [1]))

    async def lead() -> None:  # it gathers its turn, then is cancelled at the checkpoint
        with anyio.CancelScope() as scope:
            scope.cancel()
            await batcher.run(script, [key], [100])

    async with anyio.create_task_group() as tg:
        tg.start_soon(lead)
        for _ in range(3):
            tg.start_soon(follow)
    assert sorted(followers) == [1, 2, 3]
    assert await redis.get(key) == "3"
