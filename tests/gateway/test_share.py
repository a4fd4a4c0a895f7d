"""The pool's fair share across replicas on a real Redis: a tenant is granted calls until its
job's key (its service plus the job's offset) leads the lowest key waiting on any replica by
more than the slack; a tenant that becomes active is lifted, so idle time banks no credit; what
ended calls owe is paid; a replica's heads are replaced by what it publishes next and lapse with
their lifetime; an unreachable or closed store grants nothing. A policy that does not share by
weight (fcfs) orders the pool by its jobs' own keys alone, apart from another policy's order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest

from gateway.backends import BackendCapacity
from gateway.dispatch_core import DispatchCore
from gateway.errors import ShareUnavailable
from gateway.lanes import Lane
from gateway.share import Ask, Grant, Heads, RedisShare
from gateway.share_exchange import ShareExchange
from tenants.policies import JobInfo, NodeCost, ReadyCall, make_policy
from tenants.redis_client import round_trips
from tests.conftest import REDIS_URL
from tests.gateway.backends.proxy import cuttable_proxy
from tests.gateway.factories import room

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
POOL = "m"


@pytest.fixture
async def replicas(redis_prefix: str) -> AsyncIterator[tuple[RedisShare, RedisShare]]:
    a = RedisShare(REDIS_URL, "a", "vtc", slack_calls=2.0, ttl_s=60.0, prefix=redis_prefix)
    b = RedisShare(REDIS_URL, "b", "vtc", slack_calls=2.0, ttl_s=60.0, prefix=redis_prefix)
    yield a, b
    await a.aclose()
    await b.aclose()


def waiting(*tenants: str) -> Heads:
    return Heads(tenants, dict.fromkeys(tenants, 0.0))


async def test_a_tenant_leading_by_more_than_the_slack_waits_for_the_other_replica(
    replicas: tuple[RedisShare, RedisShare],
) -> None:
    a, b = replicas
    assert not await b.exchange(POOL, waiting("t2"), {})  # nothing asked: published
    grants = 0
    while await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0)):
        grants += 1
        assert grants < 100
    # the mean charge is 10: t1 may lead t2 (at 0) by 2 x 10, so its third grant took it to 30
    assert grants == 3
    assert await a.counters(POOL) == {"t1": 30.0}
    assert await b.exchange(POOL, waiting("t2"), {}, Ask("t2", 10.0))  # t2 is behind: granted
    assert await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))  # leads by 30 - 10 = 20
    assert not await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))  # 40 - 10 > 20
    assert await b.exchange(POOL, waiting("t2"), {}, Ask("t2", 10.0))
    assert await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))  # 40 - 20 <= 20
    assert await a.counters(POOL) == {"t1": 50.0, "t2": 20.0}


async def test_only_waiting_tenants_hold_others_back(
    replicas: tuple[RedisShare, RedisShare],
) -> None:
    a, b = replicas
    # t2 runs calls on b but has none to send (held by its quota): it holds nobody back
    assert not await b.exchange(POOL, Heads(("t2",), {}), {})
    for _ in range(10):
        assert await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))


async def test_a_tenant_that_becomes_active_is_lifted_to_the_least_served(
    replicas: tuple[RedisShare, RedisShare],
) -> None:
    a, b = replicas
    for _ in range(3):
        assert await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))
    # t2 arrives while t1 is active at 30: it starts at 30, not at 0
    assert await b.exchange(POOL, waiting("t2"), {}, Ask("t2", 10.0))
    assert await b.counters(POOL) == {"t1": 30.0, "t2": 40.0}
    # t1 leaves every replica; t3 arrives with nobody active: it starts at the most served
    await a.exchange(POOL, Heads((), {}), {})
    await b.exchange(POOL, Heads((), {}), {})
    assert await a.exchange(POOL, waiting("t3"), {}, Ask("t3", 1.0))
    assert (await a.counters(POOL))["t3"] == 41.0


async def test_what_ended_calls_owe_is_paid_and_refunds_count(
    replicas: tuple[RedisShare, RedisShare],
) -> None:
    a, _ = replicas
    assert await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))
    await a.exchange(POOL, waiting("t1"), {"t1": 2.5})  # used 12.5 of its 10
    await a.exchange(POOL, waiting("t1"), {"t1": -12.5})  # ... or none: a refund
    assert await a.counters(POOL) == {"t1": 0.0}


async def test_heads_are_replaced_by_the_next_publish_and_lapse_with_their_lifetime(
    redis_prefix: str,
) -> None:
    a = RedisShare(REDIS_URL, "a", "vtc", slack_calls=0.0, ttl_s=60.0, prefix=redis_prefix)
    gone = RedisShare(REDIS_URL, "gone", "vtc", slack_calls=0.0, ttl_s=0.0, prefix=redis_prefix)
    try:
        assert await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))
        # another replica's t2 (at the lifted 10) is published with no lifetime left: it lapses
        # before the next exchange, so t1 (at 10, leading nobody) is granted again
        await gone.exchange(POOL, waiting("t2"), {})
        assert await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))
        # t2 published by `a` itself counts: it joins lifted to t1's 20, and once t1 is
        # granted again it leads t2 by 10 > 0 x mean
        await a.exchange(POOL, waiting("t1", "t2"), {})
        assert await a.exchange(POOL, waiting("t1", "t2"), {}, Ask("t1", 10.0))
        assert not await a.exchange(POOL, waiting("t1", "t2"), {}, Ask("t1", 10.0))
        # `a` no longer has t2: its next publish drops it, and t1 leads nobody
        assert await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))
        assert await a.counters(POOL) == {"t1": 40.0, "t2": 20.0}
    finally:
        await a.aclose()
        await gone.aclose()


async def test_a_job_comes_in_the_pool_s_order_at_its_tenant_s_service_plus_its_offset(
    replicas: tuple[RedisShare, RedisShare],
) -> None:
    a, b = replicas
    # t1 and t2 start level (t2 lifted to t1's 10); b's t2 has a job due 15 past its service
    assert await a.exchange(POOL, waiting("t1"), {}, Ask("t1", 10.0))
    await b.exchange(POOL, Heads(("t2",), {"t2": 15.0}), {})
    # a's t1 job due 50 past: 10 + 50 leads 10 + 15 by 35 > 2 x the mean 10: it waits
    t1_long = Heads(("t1",), {"t1": 50.0})
    assert not await a.exchange(POOL, t1_long, {}, Ask("t1", 10.0, 50.0))
    # a job of t1 due 30 past leads by 15 only: granted, though t1 was served as much as t2,
    # at its key: t1's service then plus the offset
    assert await a.exchange(POOL, t1_long, {}, Ask("t1", 10.0, 30.0)) == Grant(True, 40.0)
    # b's t2 is now behind by more than the slack in the pool's order: granted
    assert await b.exchange(POOL, Heads(("t2",), {"t2": 15.0}), {}, Ask("t2", 10.0, 15.0))
    assert await a.counters(POOL) == {"t1": 20.0, "t2": 20.0}


async def test_a_tenant_s_shorter_job_on_another_replica_comes_first(
    replicas: tuple[RedisShare, RedisShare],
) -> None:
    a, b = replicas
    await b.exchange(POOL, Heads(("t1",), {"t1": 5.0}), {})
    # a's own entry for t1 (its job due 100 past) is its own choice: only b's holds it back
    mine = Heads(("t1",), {"t1": 100.0})
    assert not await a.exchange(POOL, mine, {}, Ask("t1", 10.0, 100.0))
    assert await b.exchange(POOL, Heads(("t1",), {}), {}, Ask("t1", 10.0, 5.0))
    # b has nothing of t1 waiting any more: a's job goes
    assert await a.exchange(POOL, mine, {}, Ask("t1", 10.0, 100.0))


async def test_first_come_first_served_holds_across_replicas(redis_prefix: str) -> None:
    a, b, weighted = (
        RedisShare(REDIS_URL, name, policy, slack_calls=1.0, ttl_s=60.0, prefix=redis_prefix)
        for name, policy in (("a", "fcfs"), ("b", "fcfs"), ("c", "vtc"))
    )
    try:
        # a vtc replica's service in the pool is another order's: fcfs keys do not add it
        assert await weighted.exchange(POOL, waiting("t1"), {}, Ask("t1", 1000.0))
        # b's t2 has a job that came at 100; a's t1 one that came at 101
        await b.exchange(POOL, Heads(("t2",), {"t2": 100.0}), {})
        later = Heads(("t1",), {"t1": 101.0})
        # nothing is charged, so the mean charge and the slack are 0: a second's lead waits
        assert not await a.exchange(POOL, later, {}, Ask("t1", 0.0, 101.0))
        assert await b.exchange(POOL, Heads(("t2",), {"t2": 100.0}), {}, Ask("t2", 0.0, 100.0))
        assert not await a.exchange(POOL, later, {}, Ask("t1", 0.0, 101.0))  # t2 still waits
        # b's next job of t2 came after a's: a goes first, at its arrival
        await b.exchange(POOL, Heads(("t2",), {"t2": 102.0}), {})
        assert await a.exchange(POOL, later, {}, Ask("t1", 0.0, 101.0)) == Grant(True, 101.0)
        assert await a.counters(POOL) == {"t1": 0.0, "t2": 0.0}
        assert await weighted.counters(POOL) == {"t1": 1000.0}
    finally:
        for share in (a, b, weighted):
            await share.aclose()


def test_heads_are_published_at_once_when_a_tenant_comes_earlier_only() -> None:
    published = Heads(("t1", "t2"), {"t1": 10.0})
    assert Heads(("t1", "t2"), {"t1": 5.0}).outdated(published)
    assert not Heads(("t1", "t2"), {"t1": 20.0}).outdated(published)
    assert Heads(("t1", "t2"), {"t1": 20.0, "t2": 0.0}).outdated(published)  # t2 waits
    assert Heads(("t1", "t2"), {}).outdated(published)  # t1 waits no more
    assert Heads(("t1", "t2", "t3"), {"t1": 10.0}).outdated(published)  # t3 came
    # t2 went: it goes with the next exchange, whatever it is
    assert not Heads(("t1",), {"t1": 10.0}).outdated(published)
    assert published.outdated(None)
    # with no slack, an offset that grew is published at once too
    assert Heads(("t1", "t2"), {"t1": 20.0}).outdated(published, exact=True)
    assert not Heads(("t1", "t2"), {"t1": 10.0}).outdated(published, exact=True)


async def test_no_grant_without_the_store(redis_prefix: str) -> None:
    unreachable = RedisShare("redis://127.0.0.1:1/0", "a", "vtc", socket_timeout_s=0.2)
    with pytest.raises(ShareUnavailable, match="fair-share store unavailable"):
        await unreachable.exchange(POOL, waiting("t1"), {}, Ask("t1", 1.0))
    await unreachable.aclose()
    closed = RedisShare(REDIS_URL, "a", "vtc", prefix=redis_prefix)
    await closed.aclose()
    with pytest.raises(ShareUnavailable):
        await closed.exchange(POOL, waiting("t1"), {}, Ask("t1", 1.0))


def test_a_replica_id_with_a_space_is_refused() -> None:
    with pytest.raises(ValueError, match="no space"):
        RedisShare(REDIS_URL, "a b", "vtc")


async def test_each_exchange_is_one_round_trip(replicas: tuple[RedisShare, RedisShare]) -> None:
    a, _ = replicas
    await a.exchange(POOL, waiting("t1"), {})  # the script is loaded
    before = round_trips()
    for _ in range(5):
        await a.exchange(POOL, waiting("t1"), {"t1": 1.0}, Ask("t1", 1.0))
    assert round_trips() - before == 5


class Server:
    """One server of the pool as one replica sees it (its room, healthy or not)."""

    def __init__(self, healthy: bool = True) -> None:
        self.room = room(healthy=healthy)

    def capacity(self) -> BackendCapacity:
        return self.room


def gated_lane(server: Server, tenant: str, nodes: int = 4) -> Lane:
    """A pool of one server shared with other replicas, with one job of `tenant` ready."""
    core: DispatchCore[str] = DispatchCore(make_policy("vtc"), gated=True)
    job_id = f"{tenant}-job"
    costs = tuple(NodeCost(f"n{i}", (), 16, 16.0, 64) for i in range(nodes))
    core.add_job(JobInfo(job_id, tenant, 1.0, 0.0, costs), 0.0)
    for i in range(nodes):
        call = ReadyCall(f"{job_id}/n{i}", job_id, tenant, f"n{i}", 16, 16.0, 64)
        core.add_ready(call, 16, call.call_id, 0.0)
    return Lane(POOL, {"srv": server}, core, None)  # type: ignore[dict-item, arg-type]


def exchange_of(share: RedisShare) -> ShareExchange:
    return ShareExchange(share, lambda: 0.0, lambda: False)


async def test_a_replica_that_sees_no_server_serve_holds_no_other_replica_back(
    replicas: tuple[RedisShare, RedisShare],
) -> None:
    """Its view alone (its breaker open, its scrapes stale, a partition between it and the
    servers) keeps it from sending: its tenants stay active, but none waits in the pool."""
    a, b = replicas
    a_view = Server(healthy=False)
    lane_a, lane_b = gated_lane(a_view, "t1"), gated_lane(Server(), "t2")
    exchange_a, exchange_b = exchange_of(a), exchange_of(b)
    await exchange_a.exchange(lane_a)
    # t2 leads t1 (at 0) far past the slack of 2 x 10, and is granted: t1 could not go anyway
    for _ in range(10):
        assert await exchange_b.exchange(lane_b, Ask("t2", 10.0))
    assert exchange_a.heads(lane_a) == Heads(("t1",), {})
    a_view.room = room()  # the server serves again in a's view: t1 waits, t2 waits for it
    await exchange_a.exchange(lane_a)
    assert exchange_a.heads(lane_a) == Heads(("t1",), {"t1": 0.0})
    assert not await exchange_b.exchange(lane_b, Ask("t2", 10.0))
    assert await a.counters(POOL) == {"t2": 100.0}


async def test_at_close_a_replica_pays_what_it_owes_and_leaves_the_pool(
    replicas: tuple[RedisShare, RedisShare],
) -> None:
    a, b = replicas
    lane_a, lane_b = gated_lane(Server(), "t1"), gated_lane(Server(), "t2")
    never = Lane("never", {"srv": Server()}, DispatchCore(make_policy("vtc"), gated=True), None)  # type: ignore[dict-item, arg-type]
    exchange_a, exchange_b = exchange_of(a), exchange_of(b)
    assert await exchange_a.exchange(lane_a, Ask("t1", 10.0))  # t1 at 10, still waiting
    for _ in range(3):  # t2 joins at 10 and leads t1 by at most 2 x 10
        assert await exchange_b.exchange(lane_b, Ask("t2", 10.0))
    assert not await exchange_b.exchange(lane_b, Ask("t2", 10.0))
    lane_a.core.owe({"t1": -10.0})  # its call ended unrun: its grant owed back
    before = round_trips()
    await exchange_a.close([lane_a, never])
    assert round_trips() - before == 1  # a pool it never published in is left alone
    assert lane_a.core.owed == {}
    assert await a.counters(POOL) == {"t1": 0.0, "t2": 40.0}
    # a's t1 waits no more: t2 leads nobody
    for _ in range(5):
        assert await exchange_b.exchange(lane_b, Ask("t2", 10.0))


async def test_at_close_what_cannot_be_paid_is_logged_and_close_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unreachable = RedisShare("redis://127.0.0.1:1/0", "a", "vtc", socket_timeout_s=0.2)
    lane = gated_lane(Server(), "t1")
    lane.core.owe({"t1": -30.0})
    try:
        await exchange_of(unreachable).close([lane])
    finally:
        await unreachable.aclose()
    assert "left unpaid in the share of m: {'t1': -30.0}" in caplog.text


async def test_an_exchange_whose_reply_was_lost_charges_and_pays_once(
    redis_prefix: str, replicas: tuple[RedisShare, RedisShare]
) -> None:
    """The client sends a script again when its connection drops: the same exchange is answered
    as it ran (it granted a second call and paid again); one whose retry's reply was lost too,
    or that was cancelled, is sent again under its nonce before the pool's next exchange."""
    _, b = replicas  # straight to Redis: the counters as they are
    redis = urlsplit(REDIS_URL)
    async with cuttable_proxy(redis.port or 6379) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}{redis.path}"
        a = RedisShare(url, "a", "vtc", prefix=redis_prefix)
        try:
            lane, exchange = gated_lane(Server(), "t1"), exchange_of(a)
            await exchange.exchange(lane)  # the script loaded
            proxy.lose_reply_to(redis_prefix.encode())
            assert await exchange.exchange(lane, Ask("t1", 100.0))
            assert proxy.replies_lost == 1
            assert await b.counters(POOL) == {"t1": 100.0}
            lane.core.owe({"t1": -5.0})
            proxy.lose_reply_to(redis_prefix.encode(), times=2)
            with pytest.raises(ShareUnavailable):
                await exchange.exchange(lane, Ask("t1", 10.0))
            assert proxy.replies_lost == 3
            # it had run: answered so, its grant (which no call took) is owed back and paid
            await exchange.exchange(lane)
            assert await b.counters(POOL) == {"t1": 95.0}
            lane.core.owe({"t1": -5.0})
            with anyio.CancelScope() as scope:  # sent or not as it was cancelled
                scope.cancel()
                await exchange.exchange(lane, Ask("t1", 10.0))
            await exchange.exchange(lane)
            assert await b.counters(POOL) == {"t1": 90.0}
        finally:
            await a.aclose()


async def test_while_one_exchange_sends_the_unanswered_again_the_pool_s_others_fail_at_once(
    redis_prefix: str,
) -> None:
    """An outage keeps no more unanswered exchanges than were under way when it began: while one
    task sends them again, the pool's other exchanges fail at once, sending nothing and keeping
    nothing; once the store is back, the first exchange sends each again, then its own."""
    redis = urlsplit(REDIS_URL)
    async with cuttable_proxy(redis.port or 6379) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}{redis.path}"
        a = RedisShare(url, "a", "vtc", socket_timeout_s=0.2, prefix=redis_prefix)
        back = RedisShare(REDIS_URL, "a", "vtc", prefix=redis_prefix)
        try:
            lane, exchange = gated_lane(Server(), "t1"), exchange_of(a)
            await exchange.exchange(lane)  # the script loaded
            with anyio.CancelScope() as scope:  # unanswered: kept
                scope.cancel()
                await exchange.exchange(lane, Ask("t1", 10.0))
            proxy.freeze()  # the store goes silent
            resent = anyio.Event()

            async def send_again() -> None:
                with pytest.raises(ShareUnavailable):
                    await exchange.exchange(lane, Ask("t1", 10.0))
                resent.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(send_again)
                await anyio.wait_all_tasks_blocked()  # its resend waits on the silent store
                before = round_trips()
                for _ in range(5):
                    with pytest.raises(ShareUnavailable):
                        await exchange.exchange(lane, Ask("t1", 10.0))
                assert round_trips() == before and not resent.is_set()
            exchange.share = back  # the store is back: the one kept is sent again, then its own
            before = round_trips()
            assert await exchange.exchange(lane, Ask("t1", 10.0))
            assert round_trips() - before == 2
            await exchange.exchange(lane)  # nothing left to send again
            assert round_trips() - before == 3
            assert await back.counters(POOL) == {"t1": 10.0}
        finally:
            await a.aclose()
            await back.aclose()


async def test_an_exchange_publishes_its_heads_as_they_are_after_sending_the_unanswered(
    replicas: tuple[RedisShare, RedisShare], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = replicas
    view = Server()
    lane_a, lane_b = gated_lane(view, "t1"), gated_lane(Server(), "t2")
    exchange_a, exchange_b = exchange_of(a), exchange_of(b)
    with anyio.CancelScope() as scope:  # unanswered: kept
        scope.cancel()
        await exchange_a.exchange(lane_a)
    send = a.exchange

    async def view_lost_as_sent(*args: Any, **kwargs: Any) -> Grant:
        view.room = room(healthy=False)  # no server serves in a's view from now on
        return await send(*args, **kwargs)

    monkeypatch.setattr(a, "exchange", view_lost_as_sent)
    await exchange_a.exchange(lane_a)  # sends the unanswered again, then its own
    # a's t1 waits no more: t2 is granted far past the slack of 2 x 10
    for _ in range(10):
        assert await exchange_b.exchange(lane_b, Ask("t2", 10.0))
