"""Room news's subscription against a real Redis behind a proxy that can go silent."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from gateway.room_news import RoomNews
from tests.gateway.backends.conftest import backend_on, remote
from tests.gateway.backends.proxy import cuttable_proxy

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
REDIS_PORT = 6379
PING_S = 0.2


async def test_a_subscription_cut_without_a_word_is_opened_again(tokenizer_dir: Path) -> None:
    """A lost host or a network cut raises nothing on a socket that only reads, and the Redis
    client's health check sent its ping without looking for the answer: the subscription
    looked alive, and every replica's news was lost, until the kernel gave up on the
    connection (about 15 minutes). An unanswered ping now drops it, and it is opened again."""
    async with (
        remote() as server,
        backend_on(server.url, tokenizer_dir) as backend,
        cuttable_proxy(REDIS_PORT) as proxy,
        RoomNews(f"redis://127.0.0.1:{proxy.port}", "b", [backend], ping_s=PING_S) as news,
    ):
        with anyio.fail_after(10):
            await news.subscribed()
        proxy.freeze()  # the subscription's connection hears nothing more, and is not closed
        proxy.thaw()  # a new one would go through
        with anyio.fail_after(10):  # two pings' time, and a second's wait before it is opened
            await proxy.connection()
            await news.subscribed()
