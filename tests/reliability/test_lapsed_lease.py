"""A replica whose lease renewals fail fences itself: once its last renewal sent is older than
the lease less its margin (by its own clock, driven here by hand), a call of the job running
there is aborted (it ran on to its end beside the next owner's), released, not settled, and its
node is left for whoever owns the job next: another replica that claimed it, or this one once
a renewal succeeds. The tenant pays the node once (it paid it twice: the lapsed owner settled
the call it ran to its end, and the replica that claimed the job ran the node again and settled
it too)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from fairgate.v1 import gateway_pb2 as pb
from gateway.errors import JournalUnavailable
from gateway.journal import RedisJournal
from gateway.journaling import Journaling
from gateway.outbox import Close
from tests.fake_clock import FakeClock
from tests.reliability.harness import Reliable, node, reruns
from tests.reliability.redis_server import RedisServer
from tests.reliability.test_replicas import LEASE_TTL_S, lost_event, replica, running_watch

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


class Closes:
    """Every quota close the replica sends for a job's calls, as it sends it."""

    def __init__(self, h: Reliable) -> None:
        self.job_id = ""
        self.seen: list[Close] = []
        self._more = anyio.Event()
        outbox = h.gateway.dispatcher.outbox
        real = outbox.send

        async def noted(close: Close) -> Any:
            if self.job_id and close.subject.startswith(f"{self.job_id}/"):
                self.seen.append(close)
                self._more.set()
                self._more = anyio.Event()
            return await real(close)

        outbox.send = noted  # type: ignore[method-assign]

    async def sent(self, count: int) -> list[Close]:
        while len(self.seen) < count:
            await self._more.wait()
        return self.seen


async def test_a_lapsed_owner_releases_its_call_and_the_replica_that_claimed_the_job_charges_it(
    redis: RedisServer, tmp_path: Path
) -> None:
    async with replica(redis, tmp_path, "a") as a, replica(redis, tmp_path, "b") as b:
        b.keys["t1"] = await a.tenant("t1")
        journaling, clock = fenced_by_hand(a)
        partition, lost = Partition(journaling.journal), lost_event(journaling)
        closes = Closes(a)
        job = await a.submit("t1", pb.JobSpec(nodes=[node("n0", "hello", TOKENS)]))
        closes.job_id = job.job_id
        await running_watch(a, "t1", job.job_id)
        partition.cut = True  # a's lease lapses in Redis and b claims the job
        clock.advance(LEASE_TTL_S)  # by a's clock its last renewal sent is a lease old
        with anyio.fail_after(30):
            (first,) = await closes.sent(1)  # a has stopped its call
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
    assert usage.active_reservations == 0  # neither replica holds a reservation of the job


async def test_a_fenced_owner_stops_its_call_starts_nothing_until_renewed_then_runs_it_once(
    redis: RedisServer, tmp_path: Path
) -> None:
    async with replica(redis, tmp_path, "a") as a:
        await a.tenant("t1")
        journaling, clock = fenced_by_hand(a)
        partition, closes = Partition(journaling.journal), Closes(a)
        dispatcher = a.gateway.dispatcher
        started_fenced: list[bool] = []  # for each call sent to a backend
        aborted: list[tuple[bool, int]] = []  # for each abort: fenced, its node's tokens so far
        for backend in dispatcher.backends.values():
            submit, abort = backend.submit, backend.abort

            def noted(call: Any, _submit: Any = submit) -> Any:
                run = dispatcher.runs[call.call_id.split("/")[0]]
                started_fenced.append(journaling.fenced(run))
                return _submit(call)

            def stopped(call_id: str, _abort: Any = abort) -> None:
                job_id, node_id = call_id.split("/")
                run = dispatcher.runs[job_id]
                aborted.append((journaling.fenced(run), run.nodes[node_id].output_tokens))
                _abort(call_id)

            backend.submit = noted  # type: ignore[method-assign]
            backend.abort = stopped  # type: ignore[method-assign]
        job = await a.submit("t1", pb.JobSpec(nodes=[node("n0", "hello", TOKENS)]))
        closes.job_id = job.job_id
        events = await running_watch(a, "t1", job.job_id)
        partition.cut = True
        clock.advance(LEASE_TTL_S)
        with anyio.fail_after(30):
            (first,) = await closes.sent(1)  # the call was stopped as a's deadline passed
        assert first.op == "release"
        ((fenced, tokens),) = aborted
        assert fenced and tokens < TOKENS  # aborted mid-way, not run on to its end
        partition.cut = False  # the next renewal lands: the job is a's still
        with anyio.fail_after(30):
            again, final = await reruns(events)
            await closes.sent(2)
        await dispatcher.outbox.wait_drained()
        usage = await a.usage("t1")
    assert started_fenced == [False, False]  # the first attempt, and the one once renewed
    assert again == {"n0": "its job's lease may have lapsed: running again"}
    assert final is not None and final.state == pb.JOB_STATE_SUCCEEDED
    assert [close.op for close in closes.seen] == ["release", "settle"]
    assert (usage.settled_calls, usage.output_tokens) == (1, final.nodes[0].output_tokens)
    assert usage.active_reservations == 0
