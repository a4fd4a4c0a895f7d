"""A replica whose lease renewals fail fences itself: once its last renewal sent is older than
the lease less its margin (by its own clock, driven here by hand), a call of the job that ends
there is released, not settled, and its node is left for whoever owns the job next: another
replica that claimed it, or this one once a renewal succeeds. The tenant pays the node once
(it paid it twice: the lapsed owner settled the call it ran to its end, and the replica that
claimed the job ran the node again and settled it too)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from fairgate.v1 import gateway_pb2 as pb
from gateway.errors import JournalUnavailable
from gateway.job_run import JobRun
from gateway.journal import RedisJournal
from gateway.journaling import Journaling
from gateway.outbox import Close
from tests.fake_clock import FakeClock
from tests.reliability.harness import Reliable, node
from tests.reliability.redis_server import RedisServer
from tests.reliability.test_replicas import LEASE_TTL_S, replica, running_watch

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
TOKENS = 300  # one call of ~3 s on the simulated engine (0.01 s a token)


class Partition:
    """Cuts the replica's journal off (its writes, renewals, scans and claims fail) until
    healed; its quota store stays reachable."""

    def __init__(self, journal: RedisJournal) -> None:
        self.cut = False
        for name in ("append", "renew", "orphans", "claim"):
            setattr(journal, name, self._cuttable(getattr(journal, name)))

    def _cuttable(self, real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.cut:
                raise JournalUnavailable("job journal unavailable")
            return await real(*args, **kwargs)

        return call


def fenced_by_hand(h: Reliable) -> tuple[Journaling, FakeClock]:
    """The replica's journaling on a clock the test moves (set before any job is attached)."""
    journaling = h.gateway.journaling
    assert journaling is not None
    clock = journaling.clock = FakeClock()
    return journaling, clock


def closes_of(h: Reliable, call_id: str) -> anyio.abc.ObjectReceiveStream[Close]:
    """Every quota close the replica sends for the call's attempts, as it sends it."""
    outbox = h.gateway.dispatcher.outbox
    send, receive = anyio.create_memory_object_stream[Close](16)
    real = outbox.send

    async def noted(close: Close) -> Any:
        if close.subject.startswith(call_id):
            send.send_nowait(close)
        return await real(close)

    outbox.send = noted  # type: ignore[method-assign]
    return receive


def lost_event(journaling: Journaling) -> anyio.Event:
    lost, on_lost = anyio.Event(), journaling.on_lost

    def noted(run: JobRun) -> None:
        on_lost(run)
        lost.set()

    journaling.on_lost = noted
    return lost


async def test_a_lapsed_owner_releases_its_call_and_the_replica_that_claimed_the_job_charges_it(
    redis: RedisServer, tmp_path: Path
) -> None:
    async with replica(redis, tmp_path, "a") as a, replica(redis, tmp_path, "b") as b:
        b.keys["t1"] = await a.tenant("t1")
        journaling, clock = fenced_by_hand(a)
        partition, lost = Partition(journaling.journal), lost_event(journaling)
        job = await a.submit("t1", pb.JobSpec(nodes=[node("n0", "hello", TOKENS)]))
        closes = closes_of(a, f"{job.job_id}/n0")
        await running_watch(a, "t1", job.job_id)
        partition.cut = True  # a's call runs on; its lease lapses in Redis and b claims the job
        clock.advance(LEASE_TTL_S)  # by a's clock its last renewal sent is a lease old
        with anyio.fail_after(30):
            first = await closes.receive()  # a's call has ended
            final = await b.finished("t1", job.job_id)  # b ran n0 again
        assert first.op == "release"
        partition.cut = False
        with anyio.fail_after(10):
            await lost.wait()  # a's next renewal finds the job b's: a's copy stops
        await a.gateway.dispatcher.outbox.wait_drained()
        await b.gateway.dispatcher.outbox.wait_drained()
        usage = await b.usage("t1")
    assert final.state == pb.JOB_STATE_SUCCEEDED
    assert (usage.settled_calls, usage.output_tokens) == (1, final.nodes[0].output_tokens)
