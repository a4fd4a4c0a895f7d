"""This replica's side of the job journal: it writes, renews and takes over.

Each journaled job's events are written in order, one batch per job per pass (all jobs' batches
in one round trip), and only then marked durable, so watchers hear only of what a replica's
death cannot undo. While Redis cannot be reached the batches wait and are sent again with capped
backoff (watchers wait too: nothing fails open). Every `lease_ttl_s / 3` the replica renews the
leases of the jobs it owns; a job another replica took over (its lease ran out while this one
could not renew, or its token was fenced off at a write) is handed to `on_lost`, a cancel asked
on another replica to `on_cancel`. On the same tick it looks for orphans (open jobs whose owner's
lease ran out: the replica died) and claims up to `scan_limit` of them for `on_orphan`.

`hand_over()` is the graceful end: pending events are written (within `flush_s`), every owned
job is detached and handed back, so another replica (or this one restarted) claims it at once;
a call aborted here runs again there, and one that ended here was journaled as ended.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskGroup

from gateway.errors import JournalUnavailable
from gateway.job_run import JobEnded, JobEvent, JobRun, TokensAdded
from gateway.journal import Owned, RedisJournal
from gateway.owned import OwnsTasks

log = logging.getLogger(__name__)
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0
SCAN_LIMIT = 16
QUIET_POLL_S = 0.01  # at hand-over, how often a call being settled is looked for again


class Journaling(OwnsTasks):
    def __init__(
        self,
        journal: RedisJournal,
        on_orphan: Callable[[Owned, JobRun, bool], Awaitable[None]],
        on_lost: Callable[[JobRun], None],
        on_cancel: Callable[[JobRun], None],
        *,
        scan_limit: int = SCAN_LIMIT,
        flush_s: float = 2.0,
    ) -> None:
        super().__init__()
        self.journal = journal
        self.on_orphan, self.on_lost, self.on_cancel = on_orphan, on_lost, on_cancel
        self.scan_limit = scan_limit
        self.flush_s = flush_s
        self._owned: dict[str, tuple[Owned, JobRun]] = {}
        self._pending: dict[str, list[JobEvent]] = {}
        self._wake = anyio.Event()
        # one batch in flight at a time: a second writer would send later events of a job
        # before its earlier ones landed, and hand_over must see what is still on its way
        self._writing = anyio.Lock()
        self._stopping = False

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._write_loop)
        tg.start_soon(self._lease_loop)

    @property
    def owned(self) -> int:
        return len(self._owned)

    def attach(self, owned: Owned, run: JobRun) -> None:
        """Journal the job's events from now on (those it has are in the journal already)."""
        run.epoch = owned.token
        run.journal = self._record
        self._owned[run.job_id] = (owned, run)

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
            except JournalUnavailable:
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
        batches = [(self._owned[j][0], events) for j, events in pending.items() if j in self._owned]
        try:
            written = await self.journal.append(
                [(o, e, isinstance(e[-1].body, JobEnded)) for o, e in batches]
            )
        except BaseException:  # unavailable, or cancelled on its way: sent again later
            for job_id, events in pending.items():
                self._pending[job_id] = events + self._pending.get(job_id, [])
            raise
        for (owned, events), ok in zip(batches, written, strict=True):
            entry = self._owned.get(owned.job_id)
            if entry is None:
                continue
            run = entry[1]
            if not ok:
                self._lose(owned.job_id)
                continue
            run.mark_durable(events[-1].sequence)
            if run.ended and run.last_sequence == events[-1].sequence:
                del self._owned[owned.job_id]

    def _lose(self, job_id: str) -> None:
        _, run = self._owned.pop(job_id)
        self._pending.pop(job_id, None)
        log.warning("job %s was taken over by another replica", job_id)
        run.detach()
        self.on_lost(run)

    def _only_deltas_pending(self) -> bool:
        return all(isinstance(e.body, TokensAdded) for b in self._pending.values() for e in b)

    async def _lease_loop(self) -> None:
        while True:
            try:
                await self._renew()
                await self._adopt()
            except JournalUnavailable:
                pass  # tried again next tick; a lease outlives two missed ticks
            except Exception:  # the loop serves every job: it must go on
                log.exception("journal lease tick")
            await anyio.sleep(self.journal.lease_ttl_s / 3)

    async def _renew(self) -> None:
        owned = [o for o, _ in self._owned.values()]
        if not owned:
            return
        renewed = await self.journal.renew(owned)
        for job in renewed.lost:
            if job.job_id in self._owned and self._owned[job.job_id][0] == job:
                self._lose(job.job_id)
        for job in renewed.cancel_asked:
            entry = self._owned.get(job.job_id)
            if entry is not None and not entry[1].ended:
                self.on_cancel(entry[1])

    async def _adopt(self) -> None:
        if self._stopping:
            return
        for tenant_id, job_id in await self.journal.orphans(self.scan_limit):
            claimed = await self.journal.claim(tenant_id, job_id)
            if claimed is None:
                continue
            owned, run, cancel_asked = claimed
            log.info("taking over job %s (token %d)", job_id, owned.token)
            await self.on_orphan(owned, run, cancel_asked)

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
            owned = [o for o, _ in self._owned.values()]
            for _, run in self._owned.values():
                run.detach()
            self._owned.clear()
            then()
        finally:
            if held:
                self._writing.release()
        try:
            await self.journal.hand_back(owned)
        except JournalUnavailable:
            log.warning("could not hand %d jobs back: they wait for their leases", len(owned))
