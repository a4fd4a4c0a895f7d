"""Quota scripts issued in the same event-loop turn go to Redis as one pipeline.

Concurrent calls each run a few quota scripts; sent one by one, each pays a round trip of its
own: a pooled connection, a write, a read, the caller's wake-up. The first script of a turn waits
one turn (a checkpoint) while the others of that turn join it, then all go out in one
non-transactional pipeline and each caller gets its own reply. Each script stays atomic in
Redis, replies come back in order; only the round trip is shared. A lone script is sent as it
is. A script Redis does not know (after SCRIPT FLUSH) is run again on its own, which loads it.

Cancellation: a caller cancelled before its batch is sent is left out of it; once sent, the
batch is shielded so that every other caller still gets its reply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

MAX_BATCH = 64


@dataclass(slots=True)
class _Queued:
    script: AsyncScript
    keys: Sequence[str]
    args: Sequence[str | int]
    reply: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ScriptBatcher:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._gathering: list[_Queued] | None = None

    async def run(self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """The script's reply; RedisError when it or the connection fails."""
        queued = _Queued(script, keys, args)
        if self._gathering is not None and len(self._gathering) < MAX_BATCH:
            self._gathering.append(queued)
            return await queued.reply
        batch = self._gathering = [queued]
        try:
            await anyio.lowlevel.checkpoint()  # the other scripts of this turn join
        except BaseException:
            queued.reply.cancel()  # not sent: left out
            raise
        finally:
            if self._gathering is batch:
                self._gathering = None
            with anyio.CancelScope(shield=True):
                await self._send([q for q in batch if not q.reply.done()])
        return queued.reply.result()

    async def _send(self, batch: list[_Queued]) -> None:
        if not batch:
            return
        try:
            if len(batch) == 1:
                replies = [await _alone(batch[0])]
            else:
                replies = await self._pipeline(batch)
        except Exception as exc:  # the connection failed: every caller learns it
            replies = [exc] * len(batch)
        for queued, reply in zip(batch, replies, strict=True):
            if queued.reply.done():
                continue
            if isinstance(reply, BaseException):
                queued.reply.set_exception(reply)
            else:
                queued.reply.set_result(reply)

    async def _pipeline(self, batch: list[_Queued]) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for q in batch:
                pipe.evalsha(q.script.sha, len(q.keys), *q.keys, *q.args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                replies[i] = await _alone(batch[i])
        return replies


async def _alone(queued: _Queued) -> Any:
    try:
        return await queued.script(keys=queued.keys, args=queued.args)
    except Exception as exc:
        return exc
