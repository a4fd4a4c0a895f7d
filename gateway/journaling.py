"""This replica's side of the job journal: it writes, renews and takes over.

Each journaled job's events are written in order, one batch per job per pass (all jobs' batches
in one round trip), and only then marked durable, so watchers hear only of what a replica's
death cannot undo. While Redis cannot be reached the batches wait and are sent again with capped
backoff (watchers wait too: nothing fails open); a batch the journal refuses for good (another
replica owns the job, or the journal lost events it had acknowledged: a gap) loses its job here,
as does a batch that cannot be built (a bug: logged; the other jobs' batches are written), and
whatever else one pass raises is logged and the pass tried again. Every `lease_ttl_s / 3`,
counted from when the last renewal was sent (not answered: one still unanswered then is cut off
and sent again), the replica renews the leases of the jobs it owns; a job another replica took
over (its lease ran out while this one could not renew, or its token was fenced off at a write)
is handed to `on_lost`, a cancel asked on another replica to `on_cancel`. As often, in a loop of
its own (a slow take-over must not hold the renewals back, or this replica's own jobs would
lapse), it looks for orphans (open jobs whose owner's lease ran out: the replica died) and claims
up to `scan_limit` of them, journaled from then on, for `on_orphan`; one that cannot run here
now (`give_back`) goes back to the journal at once.

With a batch now and then the writer sends the job's state as of its last event (a snapshot):
once the events since the last one pass `SNAPSHOT_MIN_EVENTS`, or the last one's size over
`SNAPSHOT_BYTES_PER_EVENT` when that is more. A replica answering for a job it does not run reads
the snapshot and replays the events after it: the work is bounded by the job's size, not by how
many events it has had (16,896 token deltas of a 256-node job took ~0.5 s to replay, against
~2 ms for the owner to answer), and the owner writes at most `SNAPSHOT_BYTES_PER_EVENT` of
snapshot per event (amortised; a small job's snapshot is a few hundred bytes).

Self-fencing: Redis judges a lease by its own clock, so this replica cannot know when another
claims its job, only a time before which nobody can: each owned job has a deadline by the injected
monotonic `clock`, the moment its last successful create, claim or renewal was *sent* plus
`lease_ttl_s` less `LEASE_MARGIN` of it (the script sets the lease at or after the send, so the
lease in Redis outlives the deadline). Past it the job is `fenced`: the dispatcher neither
charges a call of it that ends nor starts one (the job may run elsewhere), until a renewal
succeeds (`on_renewed`) or finds it lost. A job taken over (detached) is fenced for good. One
timer (`Deadlines`, on the same clock) tells `on_fenced` of each job whose deadline passes with
no renewal landed to move it, so that its running calls stop then, not when they end.

`hand_over()` is the graceful end: pending events are written (within `flush_s`), every owned
job is detached and handed back, so another replica (or this one restarted) claims it at once;
a call aborted here runs again there, and one that ended here was journaled as ended. A job
created or claimed once it began is handed back as soon as it is.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup

from gateway.deadlines import Deadlines
from gateway.errors import JournalUnavailable
from gateway.job_run import JobEnded, JobEvent, JobRun, TokensAdded
from gateway.journal import Batch, Owned, RedisJournal
from gateway.journal_codec import encode_snapshot
from gateway.owned import OwnsTasks

log = logging.getLogger(__name__)
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0
SCAN_LIMIT = 16
QUIET_POLL_S = 0.01  # at hand-over, how often a call being settled is looked for again
# a replica replays up to this many events of a job it answers for (~30 us each through
# redis-py) beyond its snapshot, however small the job
SNAPSHOT_MIN_EVENTS = 256
# and a large job's snapshot is written again after its size over this many events: reading
# and restoring a byte of snapshot costs ~20 ns, an event ~30 us, so the events replayed cost
# at most ~3x the snapshot's read, while the owner writes no more than this per event
SNAPSHOT_BYTES_PER_EVENT = 512
# of `lease_ttl_s`: a job is fenced this long before its lease can lapse in Redis, so that a
# call settled just before has its end journaled in time; below a third (a renewal tick), so one
# missed renewal never fences (the next is sent by then, however long the missed one hung)
LEASE_MARGIN = 1 / 6


@dataclass(slots=True)
class _Job:
    """A job this replica journals: its ownership, the run, and when its next snapshot is due."""

    owned: Owned
    run: JobRun
    fence_at: float  # by the journaling's clock: past it another replica may own the job
    since_snapshot: int = 0  # events written since the last snapshot
    snapshot_every: int = SNAPSHOT_MIN_EVENTS

    def batch(self, events: list[JobEvent]) -> Batch:
        """The next batch: with a snapshot when one is due (the run has no event beyond the
        batch's last, so its state is the batch's)."""
        due = self.since_snapshot + len(events) >= self.snapshot_every
        snapshot = ""
        if due and self.run.last_sequence == events[-1].sequence:
            snapshot = encode_snapshot(self.run)
        return Batch(self.owned, events, isinstance(events[-1].body, JobEnded), snapshot)

    def written(self, batch: Batch) -> None:
        if batch.snapshot:
            self.since_snapshot = 0
            every = len(batch.snapshot) // SNAPSHOT_BYTES_PER_EVENT
            self.snapshot_every = max(SNAPSHOT_MIN_EVENTS, every)
        else:
            self.since_snapshot += len(batch.events)


class Journaling(OwnsTasks):
    def __init__(
        self,
        journal: RedisJournal,
        on_orphan: Callable[[Owned, JobRun, bool], Awaitable[None]],
        on_lost: Callable[[JobRun], None],
        on_cancel: Callable[[JobRun], None],
        *,
        on_renewed: Callable[[], None] = lambda: None,
        on_fenced: Callable[[JobRun], None] = lambda run: None,
        clock: Callable[[], float] = time.monotonic,
        scan_limit: int = SCAN_LIMIT,
        flush_s: float = 2.0,
    ) -> None:
        super().__init__()
        self.journal = journal
        self.on_orphan, self.on_lost, self.on_cancel = on_orphan, on_lost, on_cancel
        self.on_renewed = on_renewed  # fenced jobs may be unfenced: their calls may start
        self.on_fenced = on_fenced  # the job's deadline passed: what runs of it must stop
        self.clock = clock
        # each owned job's `fence_at`; read through `self.clock`, which tests set by hand
        self._fences = Deadlines(lambda: self.clock(), self._fence_passed)
        self.scan_limit = scan_limit
        self.flush_s = flush_s
        self._owned: dict[str, _Job] = {}
        self._pending: dict[str, list[JobEvent]] = {}
        self._wake = anyio.Event()
        # one batch in flight at a time: a second writer would send later events of a job
        # before its earlier ones landed, and hand_over must see what is still on its way
        self._writing = anyio.Lock()
        self._stopping = False

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._write_loop)
        tg.start_soon(self._fences.run)
        tg.start_soon(functools.partial(self._lease_loop, self._renew, cut_off=True))
        # a claim cut off on its way would hold a job nobody here knows of until its lease ran
        # out, and a take-over cut off would leave it half done
        tg.start_soon(functools.partial(self._lease_loop, self._adopt, cut_off=False))

    @property
    def owned(self) -> int:
        return len(self._owned)

    def attach(self, owned: Owned, run: JobRun, sent: float) -> None:
        """Journal the job's events from now on (those it has are in the journal already);
        `sent`: when the create or claim that gave its lease was sent, by `clock`."""
        run.epoch = owned.token
        run.journal = self._record
        # a job taken over from its snapshot has had the events since it already
        since = run.last_sequence - run.log_start
        job = self._owned[run.job_id] = _Job(owned, run, self._fence_at(sent), since)
        self._fences.add(run.job_id, job.fence_at)

    async def attach_created(self, owned: Owned, run: JobRun, sent: float) -> None:
        """`attach` a job this replica has just created; one created once the hand-over began
        (a submission on its way at SIGTERM, which the server lets finish) goes straight back,
        as a claim on its way does: its submitter hears of it as usual, another replica takes
        it over at once, and nothing this replica does to it as it stops is journaled."""
        self.attach(owned, run, sent)
        if self._stopping:
            with anyio.CancelScope(shield=True):  # else it waits for its lease to lapse
                await self.give_back(run.job_id)

    def _fence_at(self, sent: float) -> float:
        return sent + self.journal.lease_ttl_s * (1 - LEASE_MARGIN)

    def _fence_passed(self, job_id: str) -> None:
        """A job's deadline passed with no renewal landed to move it. A job no longer owned
        here (ended, lost, handed back) is let be: its deadline is left to pass rather than
        discarded at each way out of `_owned`."""
        job = self._owned.get(job_id)
        try:
            if job is not None:
                self.on_fenced(job.run)
        except Exception:  # the timer serves every job: it must go on
            log.exception("fencing %s", job_id)

    def fenced(self, run: JobRun) -> bool:
        """Whether another replica may own the job now: taken over (detached), or its lease
        not renewed in time; a job not journaled here (ended, or no journal) is not."""
        job = self._owned.get(run.job_id)
        return run.detached or (job is not None and self.clock() >= job.fence_at)

    def _record(self, run: JobRun, event: JobEvent) -> None:
        self._pending.setdefault(run.job_id, []).append(event)
        self._wake.set()

    async def _write_loop(self) -> None:
        backoff = BACKOFF_FIRST_S
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self._write()
            except Exception as exc:  # the loop writes every job: it must go on
                if not isinstance(exc, JournalUnavailable):
                    log.exception("writing the job journal")
                self._wake.set()
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            else:
                backoff = BACKOFF_FIRST_S

    async def _write(self) -> None:
        """Send every pending batch; on failure what was not written waits for the next try."""
        async with self._writing:
            await self._write_pending()

    async def _write_pending(self) -> None:
        pending, self._pending = self._pending, {}
        jobs = {job_id: self._owned.get(job_id) for job_id in pending}
        batches = []
        for job_id, job in jobs.items():
            if job is not None and (batch := self._batch(job, pending[job_id])) is not None:
                batches.append(batch)
        try:
            written = await self.journal.append(batches)
        except BaseException:  # unavailable, or cancelled on its way: sent again later
            for job_id, events in pending.items():
                # only to the copy they came from: one given back or lost meanwhile (and perhaps
                # claimed again, a new copy from the journal) is past them
                job = jobs[job_id]
                if job is not None and self._owned.get(job_id) is job:
                    self._pending[job_id] = events + self._pending.get(job_id, [])
            raise
        for batch, ok in zip(batches, written, strict=True):
            job = self._owned.get(batch.owned.job_id)
            if job is None or job.owned != batch.owned:
                continue
            if not ok:
                self._lose(batch.owned.job_id)
                continue
            job.written(batch)
            last = batch.events[-1].sequence
            job.run.mark_durable(last)
            if job.run.ended and job.run.last_sequence == last:
                del self._owned[batch.owned.job_id]

    def _batch(self, job: _Job, events: list[JobEvent]) -> Batch | None:
        """The job's next batch; None when it cannot be built: the job is lost here (else it
        would fail every pass, and hold every other job's events back with it), for another
        replica to claim from the journal once its lease lapses."""
        try:
            return job.batch(events)
        except Exception:
            log.exception("building the batch of job %s", job.run.job_id)
            self._lose(job.run.job_id, "cannot be journaled here")
            return None

    def _lose(self, job_id: str, why: str = "was taken over by another replica") -> None:
        run = self._owned.pop(job_id).run
        self._pending.pop(job_id, None)
        log.warning("job %s %s", job_id, why)
        run.detach()
        self.on_lost(run)

    def _only_deltas_pending(self) -> bool:
        return all(isinstance(e.body, TokensAdded) for b in self._pending.values() for e in b)

    async def _lease_loop(self, tick: Callable[[], Awaitable[None]], *, cut_off: bool) -> None:
        """`tick` every third of the lease by `clock`, counted from when the last one started,
        however long it took; with `cut_off`, a tick still under way when the next is due is
        cancelled (a renewal hung on a silent connection) and the next sent on time."""
        period = self.journal.lease_ttl_s / 3
        while True:
            started = self.clock()
            with anyio.move_on_after(period if cut_off else None) as scope:
                try:
                    await tick()
                except JournalUnavailable:
                    pass  # tried again next tick; a lease outlives two missed ticks
                except Exception:  # the loop serves every job: it must go on
                    log.exception("journal lease tick")
            if scope.cancelled_caught:
                log.warning("a lease renewal unanswered after %.1f s: cut off, sent again", period)
            await anyio.sleep(max(0.0, started + period - self.clock()))

    async def _renew(self) -> None:
        owned = [job.owned for job in self._owned.values()]
        if not owned:
            return
        sent = self.clock()
        renewed = await self.journal.renew(owned)
        fence_at = self._fence_at(sent)
        for job in owned:
            entry = self._owned.get(job.job_id)
            if entry is not None and entry.owned == job and fence_at > entry.fence_at:
                entry.fence_at = fence_at
                self._fences.add(job.job_id, fence_at)
        for job in renewed.lost:
            if job.job_id in self._owned and self._owned[job.job_id].owned == job:
                self._lose(job.job_id)
        for job in renewed.cancel_asked:
            entry = self._owned.get(job.job_id)
            if entry is not None and not entry.run.ended:
                self.on_cancel(entry.run)
        self.on_renewed()

    async def _adopt(self) -> None:
        if self._stopping:
            return
        for tenant_id, job_id in await self.journal.orphans(self.scan_limit):
            if job_id in self._owned:
                # its lease lapsed while renewals failed: the renewal keeps it or finds it lost
                continue
            sent = self.clock()
            claimed = await self.journal.claim(tenant_id, job_id)
            if claimed is None:
                continue
            owned, run, cancel_asked = claimed
            if self._stopping:  # the hand-over began while this claim was on its way
                await self.journal.hand_back([owned])
                return
            log.info("taking over job %s (token %d)", job_id, owned.token)
            self.attach(owned, run, sent)
            await self.on_orphan(owned, run, cancel_asked)

    async def give_back(self, job_id: str, *, at_once: bool = True) -> None:
        """A job taken over that cannot run here now (the store failed its admission): it goes
        back to the journal, for the next claim (here or on another replica); its events not
        yet written are dropped, as the next owner takes it from the journal. Not `at_once`,
        it is claimable once its lease lapses: behind the orphans whose leases lapsed before
        (one refused for its own tenant's sake again and again, handed back at once, would
        come first in every scan, ahead of every other tenant's)."""
        job = self._owned.pop(job_id, None)
        if job is None:
            return
        self._pending.pop(job_id, None)
        job.run.detach()
        if not at_once:
            return
        try:
            await self.journal.hand_back([job.owned])
        except JournalUnavailable:
            log.warning("could not hand job %s back: it waits for its lease", job_id)

    async def hand_over(self, quiet: Callable[[], bool], then: Callable[[], None]) -> None:
        """Write what is pending until a moment when `quiet()` (no call is between its end and
        its settle) and nothing but token deltas waits (within `flush_s`): then detach every
        owned job and call `then()` in the same step (it aborts what runs here: no call ends
        unjournaled after; the deltas left unwritten belong to calls that run again), and
        hand the jobs back."""
        self._stopping = True
        held = False  # `_writing`: no batch is on its way, only `_pending` is unwritten
        try:
            with anyio.move_on_after(self.flush_s):
                while True:
                    await self._writing.acquire()
                    held = True
                    if quiet() and self._only_deltas_pending():
                        break
                    try:
                        await self._write_pending()
                    except JournalUnavailable:
                        await anyio.sleep(BACKOFF_FIRST_S)
                    self._writing.release()
                    held = False
                    if not self._pending and not quiet():
                        await anyio.sleep(QUIET_POLL_S)
            if not held:  # out of time: a batch on its way still lands (or fails) first
                with anyio.move_on_after(self.flush_s):
                    await self._writing.acquire()
                    held = True
            owned = [job.owned for job in self._owned.values()]
            for job in self._owned.values():
                job.run.detach()
            self._owned.clear()
            then()
        finally:
            if held:
                self._writing.release()
        try:
            await self.journal.hand_back(owned)
        except JournalUnavailable:
            log.warning("could not hand %d jobs back: they wait for their leases", len(owned))
