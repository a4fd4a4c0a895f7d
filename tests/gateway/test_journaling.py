"""A replica's journal writer on a real Redis: a hand-over that starts while a batch is on its
way waits for it, so every event lands once, in order, before the job is handed back (a second
writer sent later events first, or handed the job back with its end still unwritten: the
replica taking over ran a finished call again and charged it twice); the snapshots it writes
bound what another replica replays to answer for the job."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from bench.journal import journaled_job, read_elsewhere
from gateway.errors import JournalUnavailable
from gateway.job_run import JobEvent, JobRun, NodeState
from gateway.journal import Batch, Owned, RedisJournal, Renewed
from gateway.journaling import SNAPSHOT_MIN_EVENTS, Journaling, _Job
from tests.conftest import REDIS_URL
from tests.fake_clock import FakeClock
from tests.gateway.test_journal import two_calls

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


class HeldJournal(RedisJournal):
    """Its first append waits until the test lets it go: a batch slow on its way."""

    def __init__(self, url: str, replica_id: str, **kwargs: Any) -> None:
        super().__init__(url, replica_id, **kwargs)
        self.sending = anyio.Event()
        self.go = anyio.Event()

    async def append(self, batches: Sequence[Batch]) -> list[bool]:
        if not self.sending.is_set():
            self.sending.set()
            await self.go.wait()
        return await super().append(batches)


async def no_orphan(*_: object) -> None:
    raise AssertionError("not expected")


def no_loss(_: JobRun) -> None:
    raise AssertionError("not expected")


async def test_a_hand_over_waits_for_the_batch_on_its_way(redis_prefix: str) -> None:
    journal = HeldJournal(REDIS_URL, "one", lease_ttl_s=60.0, prefix=redis_prefix)
    other = RedisJournal(REDIS_URL, "two", lease_ttl_s=60.0, prefix=redis_prefix)
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    sent = time.monotonic()  # by the Journaling's clock
    owned = await journal.create(run)
    aborted: list[bool] = []
    async with Journaling(journal, no_orphan, no_loss, no_loss) as journaling:
        journaling.attach(owned, run, sent)
        run.start(101.0)
        await journal.sending.wait()  # the started event is on its way, held
        run.mark_running("a", 7, 102.0)
        run.add_tokens("a", "hi", (1, 2), 103.0)
        run.finish_node("a", NodeState.SUCCEEDED, 104.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(journaling.hand_over, lambda: True, lambda: aborted.append(True))
            await anyio.wait_all_tasks_blocked()
            assert not aborted  # it waits for the held batch
            journal.go.set()
    assert aborted == [True]
    claimed = await other.claim("acme", "job-1")
    assert claimed is not None
    _, replayed, _ = claimed
    assert [e.sequence for e in await other.read("acme", "job-1", 0)] == [
        e.sequence for e in run.events
    ]
    assert replayed.nodes["a"].state == NodeState.SUCCEEDED  # not run again by the taker
    await journal.aclose()
    await other.aclose()


async def test_out_of_time_a_hand_over_still_waits_for_the_batch_on_its_way(
    redis_prefix: str,
) -> None:
    """A call always being settled keeps the hand-over from its quiet moment until `flush_s`
    runs out; the batch held on its way then still lands before the job is handed back."""
    flush_s = 1.0
    journal = HeldJournal(REDIS_URL, "one", lease_ttl_s=60.0, prefix=redis_prefix)
    other = RedisJournal(REDIS_URL, "two", lease_ttl_s=60.0, prefix=redis_prefix)
    run = JobRun("job-2", "acme", two_calls(), 100.0)
    sent = time.monotonic()  # by the Journaling's clock
    owned = await journal.create(run)
    journaling = Journaling(journal, no_orphan, no_loss, no_loss, flush_s=flush_s)
    async with journaling, anyio.create_task_group() as tg:
        journaling.attach(owned, run, sent)
        run.start(101.0)
        run.mark_running("a", 7, 102.0)
        run.finish_node("a", NodeState.SUCCEEDED, 103.0)
        await journal.sending.wait()  # the node's end is on its way, held
        tg.start_soon(journaling.hand_over, lambda: False, lambda: None)
        await anyio.sleep(flush_s * 1.2)  # past the deadline of the flush
        journal.go.set()
    claimed = await other.claim("acme", "job-2")
    assert claimed is not None
    assert claimed[1].nodes["a"].state == NodeState.SUCCEEDED
    await journal.aclose()
    await other.aclose()


async def test_another_replica_replays_only_the_events_since_the_last_snapshot(
    redis_prefix: str,
) -> None:
    """A job of 16 calls streaming 64 tokens one at a time (one batch of 16 deltas a step):
    at every moment another replica reads it as its owner answers, replaying less than a
    snapshot interval and one batch (it replayed every event before snapshots)."""
    journal = RedisJournal(REDIS_URL, "one", lease_ttl_s=60.0, prefix=redis_prefix)
    replayed = []
    async for run in journaled_job(journal, nodes=16, tokens=64, per_delta=1):
        replayed.append(await read_elsewhere(journal, run))
    await journal.aclose()
    assert run.last_sequence > 3 * SNAPSHOT_MIN_EVENTS
    assert max(replayed) < SNAPSHOT_MIN_EVENTS + 16


class ClaimOnItsWay(RedisJournal):
    """Its claims wait until the test lets them go; hand-backs are noted."""

    def __init__(self, url: str, replica_id: str, **kwargs: Any) -> None:
        super().__init__(url, replica_id, **kwargs)
        self.claiming, self.go, self.handed_back = anyio.Event(), anyio.Event(), anyio.Event()

    async def claim(self, tenant_id: str, job_id: str) -> tuple[Owned, JobRun, bool] | None:
        self.claiming.set()
        await self.go.wait()
        return await super().claim(tenant_id, job_id)

    async def hand_back(self, owned: Sequence[Owned]) -> None:
        await super().hand_back(owned)
        if owned:  # a hand-over with nothing owned hands back nothing
            self.handed_back.set()


async def test_a_claim_on_its_way_as_the_hand_over_begins_is_handed_back(
    redis_prefix: str,
) -> None:
    dead = RedisJournal(REDIS_URL, "dead", lease_ttl_s=60.0, prefix=redis_prefix)
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    await dead.hand_back([await dead.create(run)])  # an orphan: its replica stopped
    journal = ClaimOnItsWay(REDIS_URL, "stopping", lease_ttl_s=60.0, prefix=redis_prefix)
    async with Journaling(journal, no_orphan, no_loss, no_loss) as journaling:
        await journal.claiming.wait()  # the lease tick claims the orphan
        await journaling.hand_over(lambda: True, lambda: None)  # SIGTERM meanwhile
        journal.go.set()
        with anyio.fail_after(5):
            await journal.handed_back.wait()
        assert journaling.owned == 0  # not taken over (`no_orphan`): handed back at once
    assert await dead.orphans(10) == [("acme", "job-1")]  # any replica may claim it now
    await journal.aclose()
    await dead.aclose()


async def test_a_job_created_once_the_hand_over_began_is_handed_back_at_once(
    redis_prefix: str,
) -> None:
    """A submission on its way at SIGTERM creates its job after the hand-over: it stayed here,
    its lease renewed by a replica going away, and its cancel as the replica stopped was
    journaled."""
    journal = RedisJournal(REDIS_URL, "stopping", lease_ttl_s=60.0, prefix=redis_prefix)
    other = RedisJournal(REDIS_URL, "other", lease_ttl_s=60.0, prefix=redis_prefix)
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    async with Journaling(journal, no_orphan, no_loss, no_loss) as journaling:
        await journaling.hand_over(lambda: True, lambda: None)  # SIGTERM
        sent = journaling.clock()
        await journaling.attach_created(await journal.create(run), run, sent)
        assert journaling.owned == 0 and run.detached  # nothing of it is journaled from here
    assert await other.orphans(10) == [("acme", "job-1")]  # any replica may claim it now
    claimed = await other.claim("acme", "job-1")
    assert claimed is not None and not claimed[1].ended
    await journal.aclose()
    await other.aclose()


class CountedRenewals(RedisJournal):
    def __init__(self, url: str, replica_id: str, **kwargs: Any) -> None:
        super().__init__(url, replica_id, **kwargs)
        self.renewals = 0
        self.renewed_twice = anyio.Event()

    async def renew(self, owned: Sequence[Owned]) -> Renewed:
        renewed = await super().renew(owned)
        self.renewals += 1
        if self.renewals == 2:
            self.renewed_twice.set()
        return renewed


async def test_a_slow_take_over_holds_no_renewal_back(redis_prefix: str) -> None:
    dead = RedisJournal(REDIS_URL, "dead", lease_ttl_s=60.0, prefix=redis_prefix)
    await dead.hand_back([await dead.create(JobRun("job-1", "acme", two_calls(), 100.0))])
    journal = CountedRenewals(REDIS_URL, "alive", lease_ttl_s=0.3, prefix=redis_prefix)
    mine = JobRun("job-2", "acme", two_calls(), 100.0)
    sent = time.monotonic()  # by the Journaling's clock
    owned = await journal.create(mine)
    taking_over, done = anyio.Event(), anyio.Event()

    async def slow_take_over(*_: object) -> None:
        taking_over.set()
        await done.wait()  # encoding and store round trips that take their time

    async with Journaling(journal, slow_take_over, no_loss, no_loss) as journaling:
        journaling.attach(owned, mine, sent)
        with anyio.fail_after(5):
            await taking_over.wait()
            await journal.renewed_twice.wait()  # its own job's lease goes on meanwhile
        done.set()
    await journal.aclose()
    await dead.aclose()


class CutOffRenewals(RedisJournal):
    """Its renewals fail (Redis away for them); it notes each orphan scan and claim."""

    def __init__(self, url: str, replica_id: str, **kwargs: Any) -> None:
        super().__init__(url, replica_id, **kwargs)
        self.scans, self.claims = 0, 0
        self.scanned_twice = anyio.Event()

    async def renew(self, owned: Sequence[Owned]) -> Renewed:
        raise JournalUnavailable("job journal unavailable")

    async def orphans(self, limit: int) -> list[tuple[str, str]]:
        found = await super().orphans(limit)
        if found:
            self.scans += 1
            if self.scans == 2:
                self.scanned_twice.set()
        return found

    async def claim(self, tenant_id: str, job_id: str) -> tuple[Owned, JobRun, bool] | None:
        self.claims += 1
        return await super().claim(tenant_id, job_id)


async def test_a_replica_never_claims_a_job_it_runs_whose_lease_lapsed(redis_prefix: str) -> None:
    journal = CutOffRenewals(REDIS_URL, "one", lease_ttl_s=0.3, prefix=redis_prefix)
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    sent = time.monotonic()  # by the Journaling's clock
    owned = await journal.create(run)
    async with Journaling(journal, no_orphan, no_loss, no_loss) as journaling:
        journaling.attach(owned, run, sent)
        with anyio.fail_after(5):
            await journal.scanned_twice.wait()  # its own job listed as an orphan, twice
        assert journal.claims == 0 and journaling.owned == 1
    await journal.aclose()


class SlowRenewals(RedisJournal):
    """Each renewal takes `round_trip_s` of the test's clock, or fails while `away`."""

    def __init__(self, url: str, replica_id: str, clock: FakeClock, **kwargs: Any) -> None:
        super().__init__(url, replica_id, **kwargs)
        self.clock, self.round_trip_s, self.away = clock, 0.0, False

    async def renew(self, owned: Sequence[Owned]) -> Renewed:
        self.clock.advance(self.round_trip_s)
        if self.away:
            raise JournalUnavailable("job journal unavailable")
        return await super().renew(owned)


async def test_a_job_is_fenced_once_its_lease_may_have_lapsed(redis_prefix: str) -> None:
    """Its deadline: when the create was sent plus the lease less its margin (60 s less 10 s),
    then when the last successful renewal was sent (not when its answer came); a failed
    renewal leaves it; a job not journaled here is never fenced."""
    clock = FakeClock(100.0)
    journal = SlowRenewals(REDIS_URL, "one", clock, lease_ttl_s=60.0, prefix=redis_prefix)
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    owned = await journal.create(run)
    renewed: list[float] = []
    journaling = Journaling(
        journal,
        no_orphan,
        no_loss,
        no_loss,
        clock=clock,
        on_renewed=lambda: renewed.append(clock()),
    )
    journaling.attach(owned, run, 100.0)
    clock.now = 149.9
    assert not journaling.fenced(run)
    clock.now = 150.0
    assert journaling.fenced(run)
    journal.round_trip_s = 5.0
    await journaling._renew()  # sent at 150, answered at 155
    assert renewed == [155.0] and not journaling.fenced(run)
    clock.now = 199.9
    assert not journaling.fenced(run)
    journal.away = True
    with pytest.raises(JournalUnavailable):
        await journaling._renew()
    assert renewed == [155.0] and journaling.fenced(run)  # 150 + 50 has passed
    assert not journaling.fenced(JobRun("job-2", "acme", two_calls(), 100.0))
    await journal.aclose()


async def test_the_fencing_deadline_passing_is_told_at_once_unless_a_renewal_moved_it(
    redis_prefix: str,
) -> None:
    """By the injected clock, the timer tells `on_fenced` of a job whose deadline has passed
    (its running calls are to stop), once; a job whose renewal landed in time is not told."""
    clock = FakeClock(100.0)
    journal = SlowRenewals(REDIS_URL, "one", clock, lease_ttl_s=60.0, prefix=redis_prefix)
    kept, lapsed = (JobRun(f"job-{i}", "acme", two_calls(), 100.0) for i in (1, 2))
    told: list[JobRun] = []
    once = anyio.Event()

    def on_fenced(run: JobRun) -> None:
        told.append(run)
        once.set()

    journaling = Journaling(journal, no_orphan, no_loss, no_loss, on_fenced=on_fenced, clock=clock)
    journaling.attach(await journal.create(kept), kept, 100.0)  # deadline 150
    clock.now = 140.0
    await journaling._renew()  # kept's deadline 190
    journaling.attach(await journal.create(lapsed), lapsed, 100.0)  # claim sent at 100: 150
    clock.now = 160.0
    journal.away = True  # no renewal lands from now on
    async with journaling:
        with anyio.fail_after(5):
            await once.wait()
        await anyio.wait_all_tasks_blocked()
    assert told == [lapsed]
    await journal.aclose()


async def test_a_job_taken_over_is_fenced_from_when_its_claim_was_sent(redis_prefix: str) -> None:
    clock = FakeClock(100.0)
    dead = RedisJournal(REDIS_URL, "dead", lease_ttl_s=60.0, prefix=redis_prefix)
    await dead.hand_back([await dead.create(JobRun("job-1", "acme", two_calls(), 100.0))])
    journal = ClaimOnItsWay(REDIS_URL, "alive", lease_ttl_s=60.0, prefix=redis_prefix)
    taken: list[JobRun] = []
    took = anyio.Event()

    async def take_over(owned: Owned, run: JobRun, cancel_asked: bool) -> None:
        taken.append(run)
        took.set()

    async with Journaling(journal, take_over, no_loss, no_loss, clock=clock) as journaling:
        with anyio.fail_after(5):
            await journal.claiming.wait()  # sent at 100
            clock.now = 130.0  # the claim's answer comes late
            journal.go.set()
            await took.wait()
        assert journaling.owned == 1
        clock.now = 149.9
        assert not journaling.fenced(taken[0])
        clock.now = 150.0
        assert journaling.fenced(taken[0])
    await journal.aclose()
    await dead.aclose()


async def test_a_job_another_replica_took_over_is_fenced(redis_prefix: str) -> None:
    """Found lost at a renewal: its copy here is detached, and fenced whatever the clock."""
    clock = FakeClock(100.0)
    journal = SlowRenewals(REDIS_URL, "one", clock, lease_ttl_s=60.0, prefix=redis_prefix)
    other = RedisJournal(REDIS_URL, "two", lease_ttl_s=60.0, prefix=redis_prefix)
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    owned = await journal.create(run)
    lost: list[JobRun] = []
    journaling = Journaling(journal, no_orphan, lost.append, no_loss, clock=clock)
    journaling.attach(owned, run, 100.0)
    await journal.hand_back([owned])
    assert await other.claim("acme", "job-1") is not None
    await journaling._renew()
    assert lost == [run] and journaling.fenced(run)
    await journal.aclose()
    await other.aclose()


async def written(run: JobRun) -> None:
    """Until every event the run has is in the journal (its watchers see only those)."""
    with anyio.fail_after(5):
        async for event in run.watch():
            if event.sequence == run.last_sequence:
                return
    raise AssertionError(f"{run.job_id} detached with events unwritten")


async def test_a_gap_in_the_journal_loses_the_job_here_and_the_writer_goes_on(
    redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis lost writes it had acknowledged (a failover to a lagging replica): the owner's next
    batch starts past the journal's last event. The job is lost here, as one taken over is, with
    an error logged; the writer goes on with the other jobs (it raised, and its task group took
    the whole gateway down)."""
    journal = RedisJournal(REDIS_URL, "one", lease_ttl_s=60.0, prefix=redis_prefix)
    gapped, kept = (JobRun(f"job-{i}", "acme", two_calls(), 100.0) for i in (1, 2))
    lost: list[JobRun] = []
    lost_one = anyio.Event()

    def on_lost(run: JobRun) -> None:
        lost.append(run)
        lost_one.set()

    async with Journaling(journal, no_orphan, on_lost, no_loss) as journaling:
        for run in (gapped, kept):
            journaling.attach(await journal.create(run), run, time.monotonic())
        gapped.start(101.0)
        gapped.mark_running("a", 7, 102.0)
        await written(gapped)
        await journal._redis.hset(journal._job("acme", "job-1"), "seq", 1)  # event 2 lost
        await journal._redis.xdel(journal._log("acme", "job-1"), "0-2")
        gapped.add_tokens("a", "hi", (1,), 103.0)
        with anyio.fail_after(5):
            await lost_one.wait()
        kept.start(104.0)
        await written(kept)
        assert lost == [gapped] and journaling.owned == 1
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "job-1" in error.getMessage()
    await journal.aclose()


async def test_a_job_whose_batch_cannot_be_built_is_lost_and_the_others_written(
    redis_prefix: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug building one job's batch (encoding its snapshot, say) is logged and loses that job
    here, for another replica to claim from the journal; the other jobs' batches are written in
    the same pass (every job's events were put back and every pass failed alike, for ever: none
    became durable, while the renewals went on and the replica looked healthy)."""
    journal = RedisJournal(REDIS_URL, "one", lease_ttl_s=60.0, prefix=redis_prefix)
    bad, good = (JobRun(f"job-{i}", "acme", two_calls(), 100.0) for i in (1, 2))
    built = _Job.batch

    def batch(job: _Job, events: list[JobEvent]) -> Batch:
        if job.run is bad:
            raise ValueError("cannot encode the snapshot")
        return built(job, events)

    monkeypatch.setattr(_Job, "batch", batch)
    lost: list[JobRun] = []
    async with Journaling(journal, no_orphan, lost.append, no_loss) as journaling:
        for run in (bad, good):
            journaling.attach(await journal.create(run), run, time.monotonic())
        bad.start(101.0)
        good.start(101.0)  # both in one pass
        await written(good)
        assert lost == [bad] and journaling.fenced(bad) and journaling.owned == 1
    assert await journal.read("acme", "job-1", 0) == []
    assert [e.sequence for e in await journal.read("acme", "job-2", 0)] == [1]
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "job-1" in error.getMessage() and error.exc_info is not None
    await journal.aclose()


class RaisesOnce(RedisJournal):
    """Its first append raises what no Redis error is."""

    def __init__(self, url: str, replica_id: str, **kwargs: Any) -> None:
        super().__init__(url, replica_id, **kwargs)
        self.raised = False

    async def append(self, batches: Sequence[Batch]) -> list[bool]:
        if not self.raised:
            self.raised = True
            raise RuntimeError("unexpected")
        return await super().append(batches)


async def test_a_write_that_raises_is_logged_and_sent_again(
    redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    journal = RaisesOnce(REDIS_URL, "one", lease_ttl_s=60.0, prefix=redis_prefix)
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    sent = time.monotonic()  # by the Journaling's clock
    owned = await journal.create(run)
    async with Journaling(journal, no_orphan, no_loss, no_loss) as journaling:
        journaling.attach(owned, run, sent)
        run.start(101.0)
        await written(run)
    assert journal.raised
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "writing the job journal"
    ]
    assert [e.sequence for e in await journal.read("acme", "job-1", 0)] == [1]
    await journal.aclose()


class NotedRenewals(SlowRenewals):
    """Notes when each renewal was sent, by the test's clock; only the first is slow."""

    def __init__(self, url: str, replica_id: str, clock: FakeClock, **kwargs: Any) -> None:
        super().__init__(url, replica_id, clock, **kwargs)
        self.sent: list[float] = []
        self.renewed_twice = anyio.Event()

    async def renew(self, owned: Sequence[Owned]) -> Renewed:
        self.sent.append(self.clock())
        renewed = await super().renew(owned)
        self.round_trip_s = 0.0
        if len(self.sent) == 2:
            self.renewed_twice.set()
        return renewed


async def test_renewals_keep_their_cadence_however_long_each_takes(redis_prefix: str) -> None:
    """Every third of the lease from when the last renewal was sent: one that took its whole
    third is followed at once (the next waited a third after it was answered: a job's deadline
    passed with its renewal not yet sent when one was slow)."""
    clock = FakeClock(100.0)
    journal = NotedRenewals(REDIS_URL, "one", clock, lease_ttl_s=60.0, prefix=redis_prefix)
    journal.round_trip_s = 20.0
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    owned = await journal.create(run)
    fenced: list[JobRun] = []
    journaling = Journaling(
        journal, no_orphan, no_loss, no_loss, clock=clock, on_fenced=fenced.append
    )
    journaling.attach(owned, run, 100.0)
    async with journaling:
        with anyio.fail_after(5):
            await journal.renewed_twice.wait()
        assert journal.sent == [100.0, 120.0] and clock() == 120.0
        assert not journaling.fenced(run) and fenced == []  # deadline 120 + 50
    await journal.aclose()


class HungRenewal(RedisJournal):
    """Its first renewal hangs until cancelled (a silent connection); the second is noted."""

    def __init__(self, url: str, replica_id: str, **kwargs: Any) -> None:
        super().__init__(url, replica_id, **kwargs)
        self.renewals = 0
        self.cut_off = False
        self.renewed = anyio.Event()

    async def renew(self, owned: Sequence[Owned]) -> Renewed:
        self.renewals += 1
        if self.renewals == 1:
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                self.cut_off = True
                raise
        renewed = await super().renew(owned)
        self.renewed.set()
        return renewed


async def test_a_renewal_that_hangs_is_cut_off_when_the_next_is_due(redis_prefix: str) -> None:
    """The first renewal is never answered: at the next tick, a third of the lease after it was
    sent, it is cut off and the next sent, which lands before the job's deadline (half a third
    later), so the job is never fenced. (The hung one held every later renewal back.)"""
    journal = HungRenewal(REDIS_URL, "one", lease_ttl_s=1.5, prefix=redis_prefix)
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    sent = time.monotonic()  # by the Journaling's clock
    owned = await journal.create(run)
    fenced: list[JobRun] = []
    journaling = Journaling(journal, no_orphan, no_loss, no_loss, on_fenced=fenced.append)
    async with journaling:
        journaling.attach(owned, run, sent)
        with anyio.fail_after(5):
            await journal.renewed.wait()
        assert journal.cut_off and journal.renewals == 2
        assert not journaling.fenced(run) and fenced == []
    await journal.aclose()


class AppendsHeld(RedisJournal):
    """While `held`, its next append waits for the test to let it go, and then fails."""

    def __init__(self, url: str, replica_id: str, **kwargs: Any) -> None:
        super().__init__(url, replica_id, **kwargs)
        self.held = False
        self.sending, self.go = anyio.Event(), anyio.Event()

    async def append(self, batches: Sequence[Batch]) -> list[bool]:
        if self.held:
            self.held = False
            self.sending.set()
            await self.go.wait()
            raise JournalUnavailable("job journal unavailable")
        return await super().append(batches)


async def test_events_of_a_copy_given_back_never_join_the_copy_claimed_again(
    redis_prefix: str,
) -> None:
    """A batch fails on its way after its job was given back; claimed again here before the
    next write, the new copy (from the journal) is written as it ran. (The old copy's events
    were put back under the job's id and written ahead of the new copy's, under its token:
    the journal misnumbered, a node's end written as its start.)"""
    dead = RedisJournal(REDIS_URL, "dead", lease_ttl_s=60.0, prefix=redis_prefix)
    journal = AppendsHeld(REDIS_URL, "one", lease_ttl_s=60.0, prefix=redis_prefix)
    first = JobRun("job-1", "acme", two_calls(), 100.0)
    owned = await dead.create(first)
    first.start(101.0)
    first.mark_running("a", 7, 102.0)
    await dead.append([Batch(owned, first.events)])
    await dead.hand_back([owned])  # an orphan with its node a running
    async with Journaling(journal, no_orphan, no_loss, no_loss) as journaling:
        claimed = await journal.claim("acme", "job-1")
        assert claimed is not None
        journaling.attach(claimed[0], claimed[1], time.monotonic())
        journal.held = True
        claimed[1].retry_node("a", 103.0, "running again")
        await journal.sending.wait()
        await journaling.give_back("job-1")  # the quota store away: it cannot run here now
        journal.go.set()  # the batch on its way fails
        await anyio.wait_all_tasks_blocked()
        claimed = await journal.claim("acme", "job-1")
        assert claimed is not None
        _, run, _ = claimed
        journaling.attach(claimed[0], run, time.monotonic())
        run.retry_node("a", 104.0, "running again")
        run.mark_running("a", 7, 105.0)
        run.finish_node("a", NodeState.SUCCEEDED, 106.0)
        await written(run)
        assert await journal.read("acme", "job-1", 0) == run.events
    await journal.aclose()
    await dead.aclose()
