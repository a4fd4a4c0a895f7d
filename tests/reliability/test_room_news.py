"""Room news between two replicas in front of one real `fairgate engine serve` process: a call
that ends on the server its replica saw full is published on the server's Redis channel, and
the other replica, whose own scrapes come only every 10 s, sends its waiting call as soon as it
hears; a call that ends on a server with room is not news."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from bench.engine_servers import EngineServer
from fairgate.v1 import gateway_pb2 as pb
from tenants import RedisQuotaStore
from tests.gateway.engine_servers import backend_of, engine_servers
from tests.reliability.harness import Reliable, node, reliable_gateway
from tests.reliability.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
SLOW_SCRAPE_S = 10.0  # replica b's own scrapes (the most allowed): only news shows the room sooner


def replica(
    redis: RedisServer, tmp_path: Path, server: EngineServer, name: str, **backend: Any
) -> contextlib.AbstractAsyncContextManager[Reliable]:
    return reliable_gateway(
        store=RedisQuotaStore(redis.url),
        store_url=redis.url,
        replica_id=name,
        policy="fcfs",  # no fair-share grant: the room alone decides when a call is sent
        outbox_file=tmp_path / f"outbox-{name}.jsonl",
        backends=[backend_of(server, tmp_path, **backend)],
    )


@contextlib.asynccontextmanager
async def news(redis: RedisServer, server: EngineServer) -> AsyncIterator[list[str]]:
    """The news published about `server` while the block runs (the replicas' ids)."""
    heard: list[str] = []
    client = Redis.from_url(redis.url, decode_responses=True)
    async with client, client.pubsub(ignore_subscribe_messages=True) as pubsub:
        await pubsub.subscribe(f"fg:room:{server.url}")
        yield heard
        with anyio.move_on_after(0.5):  # what was published has reached the socket
            async for message in pubsub.listen():
                heard.append(message["data"])


async def streaming(h: Reliable, tenant: str, job_id: str) -> None:
    """Return once the job's first token has come."""
    request = pb.WatchJobRequest(job_id=job_id)
    async for event in h.stub.WatchJob(request, metadata=h.auth(tenant)):
        if event.WhichOneof("event") == "token_delta":
            return
    raise AssertionError(f"{job_id} ended before a token came")


def one_call(max_tokens: int) -> pb.JobSpec:
    return pb.JobSpec(nodes=[node("n", "tell me a story", max_tokens)])


async def test_a_freed_slot_reaches_the_other_replica_before_its_scrape(
    redis: RedisServer, tmp_path: Path
) -> None:
    async with (
        engine_servers(tmp_path, 1, step_s=0.01) as (server,),
        news(redis, server) as heard,
        replica(redis, tmp_path, server, "a", max_num_seqs=1) as a,
    ):
        a.keys["t"] = await a.tenant("t")
        first = await a.submit("t", one_call(300))  # 3 s on the server's one slot
        await streaming(a, "t", first.job_id)
        # b's only scrape before the news is its first, which sees the slot taken
        async with replica(redis, tmp_path, server, "b", max_num_seqs=1, **slow()) as b:
            assert a.gateway.room_news is not None and b.gateway.room_news is not None
            await b.gateway.room_news.subscribed()
            b.keys, b.jobs = a.keys, a.jobs
            with anyio.fail_after(SLOW_SCRAPE_S * 0.8):
                second = await b.run("t", one_call(8))
            assert second.state == pb.JOB_STATE_SUCCEEDED
            assert (await a.finished("t", first.job_id)).state == pb.JOB_STATE_SUCCEEDED
            assert a.gateway.room_news.published >= 1 and b.gateway.room_news.heard >= 1
            await b.unharmed()
    assert "a" in heard


def slow() -> dict[str, float]:
    return {"scrape_interval_s": SLOW_SCRAPE_S}


async def test_an_end_on_a_server_with_room_is_not_news(redis: RedisServer, tmp_path: Path) -> None:
    async with (
        engine_servers(tmp_path, 1, step_s=0.002) as (server,),
        news(redis, server) as heard,
        replica(redis, tmp_path, server, "a", max_num_seqs=8) as a,
    ):
        await a.tenant("t")
        for _ in range(3):
            assert (await a.run("t", one_call(8))).state == pb.JOB_STATE_SUCCEEDED
        assert a.gateway.room_news is not None and a.gateway.room_news.published == 0
    assert heard == []
