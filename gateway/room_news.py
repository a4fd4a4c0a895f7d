"""Room news between replicas: a call that frees room on a full server is told to the others.

Replicas that share a server learn of each other's calls only from its `/metrics`: a slot freed
by one replica's call stays unseen by the others until their next scrape, and where the pool's
order makes the replica whose call ended wait for a lower key held elsewhere, the slot idles
meanwhile. So when a call ends on a server this replica saw full (`OpenAIBackend.on_freed`),
it publishes the news on the server's Redis channel, and every other replica subscribed to it
scrapes that server at once (`scrape_soon`); the landed scrape wakes its dispatch loop. The news
carries no room itself: each replica still reads the room from the server, so no count can be
wrong, only sooner. Ends on a server with room are not news (nobody waits for it): a busy
deployment below capacity publishes nothing.

News is a hint: Redis unreachable, it is lost and the scrapes go on as before (nothing is sent
that the room does not allow, so nothing fails open). A quiet subscription is pinged every
`ping_s`, and one whose ping goes unanswered as long is opened again: a connection cut without
a word (a host lost, a network partition) raises nothing on a socket that only reads, and the
client's own health check sends its ping but never looks for the answer. Channel:
`<prefix>:room:<server url>`, the message the publishing replica's id (a replica ignores its
own).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence

import anyio
from anyio.abc import TaskGroup
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.backends import OpenAIBackend
from gateway.owned import OwnsTasks
from tenants.redis_client import RedisClient, fails_closed

log = logging.getLogger(__name__)
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0  # a lost subscription is opened again after this
SOCKET_TIMEOUT_S = 2.0
# a quiet subscription is pinged this often, and dropped when a ping goes unanswered as long
PING_S = 5.0
PING = "room-news"


class NewsLost(Exception):
    """Redis did not take the news (it is a hint: nothing waits for it)."""


class _Publisher(RedisClient):
    def __init__(self, url: str) -> None:
        super().__init__(url, 1, SOCKET_TIMEOUT_S, SOCKET_TIMEOUT_S)

    @fails_closed(NewsLost, "room news")
    async def publish(self, channels: Iterable[str], message: str) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for channel in channels:
                pipe.publish(channel, message)
            await pipe.execute()


class RoomNews(OwnsTasks):
    def __init__(
        self,
        url: str,
        replica_id: str,
        backends: Sequence[OpenAIBackend],
        prefix: str = "fg",
        ping_s: float = PING_S,
    ) -> None:
        super().__init__()
        self.replica_id = replica_id
        self._url = url
        self._ping_s = ping_s
        # backends of several models may share one server (and so its channel)
        self._channel = {b.name: f"{prefix}:room:{b.settings.url}" for b in backends}
        self._backends: dict[str, list[OpenAIBackend]] = {}
        for backend in backends:
            self._backends.setdefault(self._channel[backend.name], []).append(backend)
        self._news: set[str] = set()  # channels with news to publish
        self._has_news = anyio.Event()
        self._subscribed = anyio.Event()
        self.published = 0  # news sent, for tests and benchmarks
        self.heard = 0  # news of other replicas taken

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        self._publisher = _Publisher(self._url)
        stack.push_async_callback(self._publisher.aclose)
        for on_server in self._backends.values():
            for backend in on_server:
                backend.on_freed = self._freed
                stack.callback(setattr, backend, "on_freed", None)

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._publish_forever)
        tg.start_soon(self._listen_forever)

    def _freed(self, backend: OpenAIBackend) -> None:
        self._news.add(self._channel[backend.name])
        self._has_news.set()

    async def _publish_forever(self) -> None:
        while True:
            await self._has_news.wait()
            self._has_news = anyio.Event()
            news, self._news = self._news, set()
            with contextlib.suppress(NewsLost):  # logged where it failed
                await self._publisher.publish(news, self.replica_id)
                self.published += len(news)

    async def _listen_forever(self) -> None:
        retry_s = RETRY_FIRST_S
        while True:
            try:
                await self._listen()
            except (RedisError, OSError) as exc:
                if self._subscribed.is_set():  # it was listening: a new outage
                    retry_s = RETRY_FIRST_S
                if retry_s == RETRY_FIRST_S:  # logged once an outage
                    log.warning("room news: no subscription (%r); scrapes go on", exc)
            self._subscribed = anyio.Event()
            await anyio.sleep(retry_s)
            retry_s = min(retry_s * 2, RETRY_MAX_S)

    async def subscribed(self) -> None:
        """Return once this replica hears the others' news."""
        await self._subscribed.wait()

    async def _listen(self) -> None:
        # A connection of its own without a read timeout (a quiet channel is no failure): a
        # ping unanswered for `ping_s` finds one that was dropped unseen
        redis = Redis.from_url(
            self._url,
            decode_responses=True,
            socket_connect_timeout=SOCKET_TIMEOUT_S,
            socket_keepalive=True,
        )
        async with redis, redis.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(*self._backends)
            self._subscribed.set()
            pinged: float | None = None  # when the ping not yet answered was sent
            while True:
                message = await pubsub.get_message(timeout=self._ping_s)
                now = anyio.current_time()
                if message is not None:
                    pinged = None  # whatever came, the connection carries
                    if message["type"] == "message" and message["data"] != self.replica_id:
                        self.heard += 1
                        for backend in self._backends[message["channel"]]:
                            backend.scrape_soon()
                elif pinged is None:
                    await pubsub.ping(PING)
                    pinged = now
                elif now - pinged >= self._ping_s:
                    raise ConnectionError(f"room news: no answer to a ping in {self._ping_s:g} s")
