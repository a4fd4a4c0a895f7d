"""The job journal in Redis: what lets several gateway replicas serve one deployment.

A job's submission (a hash) and its events (a stream, one entry per event, the entry id
`0-<sequence>`) are written before any client hears of them, so any replica can answer for the
job and a watcher resumes on another replica from its last sequence. Its owner also writes, with
a batch now and then, the job's state as of that batch (`snapshot` in the hash, see
`Journaling`): a replica answering for a job it does not run, or taking it over, reads the
snapshot and replays only the events after it, not the whole log. A job is owned by one
replica under a lease (`lease_until`, judged by Redis' clock) with a fencing token: only the
token's holder may append, a lease that runs out (its replica died) or is handed back (it shut
down) lets another replica claim the job with a new token, and the old owner's late writes are
refused. Every change is one Lua script from gateway/lua/, atomic. A job whose record cannot be
decoded (corrupted, or of an incompatible version) is read as JobUnreadable, and the replica that
claims it ends it FAILED instead of taking it over: it would fail the same way at every claim.

Keys: the deployment's jobs share the `{jobs}` hash tag (`<prefix>:{jobs}:<tenant>/<job>` and its
`:log`, the open-jobs index `<prefix>:{jobs}:open` scored by lease end, idempotency records
`<prefix>:{jobs}:key:<tenant>:<digest>`, each tenant's ended jobs `<prefix>:{jobs}:ended:<tenant>`
and their sizes `...:bytes`), so every script's keys lie in one cluster slot. An ended job's keys
expire after `retention_s`, or go sooner, oldest first, once its tenant's ended jobs pass
`max_ended_per_tenant` or hold more than `max_ended_bytes_per_tenant` of Redis' memory (as the
in-process registry keeps them): one tenant's jobs cannot fill the Redis every tenant's quotas live
in. Every Redis error leaves as JournalUnavailable (the detail goes to the log): a replica that
cannot journal stops accepting and dispatching. Blocking reads (watches of jobs other replicas run)
have a client of their own, `BLOCKING_READS` connections that they wait their turn for: however
many watch, the replica's writes and renewals never wait behind them.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import anyio
from cachetools import LRUCache

from gateway.errors import JobUnreadable, JournalUnavailable
from gateway.job_run import JobEnded, JobEvent, JobRun, JobState
from gateway.jobs.model import JobSpec
from gateway.journal_codec import (
    SUBMISSION_WITHOUT_SPEC,
    Submission,
    decode_event,
    encode_event,
    restore_snapshot,
)
from gateway.registry import MAX_ENDED_BYTES_PER_TENANT, MAX_ENDED_PER_TENANT
from tenants.redis_client import RedisClient, bounded_client, fails_closed

log = logging.getLogger(__name__)
_SCRIPTS = ("create", "append", "renew", "hand_back", "claim", "cancel", "abandon")
POOL_SIZE = 32  # connections for every call but the blocking reads
# Blocking reads (a watch of a job another replica runs) at once, each on a connection of its
# own: an XREAD holds its connection for its whole wait, and on the shared pool 64 watchers
# starved this replica's renewals and appends until its leases lapsed. A read beyond them waits
# for a slot.
BLOCKING_READS = 32
IDEMPOTENCY_TTL_S = 86_400
# Specs of jobs read from the journal, decoded, counted by the memory they hold
# (`JobSpec.held_bytes`, as the registry counts them; a 256-node spec holds ~14x its base64): a
# job's spec never changes, and decoding it was about 40 % of another replica's read of that job
SPEC_CACHE_BYTES = 16 * 1024 * 1024
# a spec holding more than this part of the cache is not kept: one tenant's large job would
# evict every other tenant's specs, and each of their reads would decode again
SPEC_CACHE_ENTRY_PART = 4
# a spec longer than this (base64 characters) is decoded in a worker thread: a 15 MiB spec took
# ~50 ms, a stall of every other read, renewal and write of the replica's event loop
INLINE_DECODE_CHARS = 64 * 1024
_READ_FIELDS = (*SUBMISSION_WITHOUT_SPEC, "snapshot", "cancel")


class KeyTaken(Exception):
    """The idempotency key already names a job (its id in `job_id`)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


@dataclass(frozen=True, slots=True)
class Owned:
    """A job this replica owns, with the token its writes carry."""

    tenant_id: str
    job_id: str
    token: int


@dataclass(frozen=True, slots=True)
class Batch:
    """A job's next events, in order; `ended`: they end the job; `snapshot`: the job's state
    as of the last of them (`encode_snapshot`), or '' for none."""

    owned: Owned
    events: Sequence[JobEvent]
    ended: bool = False
    snapshot: str = ""


@dataclass(frozen=True, slots=True)
class Renewed:
    lost: list[Owned]  # taken by another replica, or gone
    cancel_asked: list[Owned]  # a replica that does not own it was asked to cancel it


def _member(tenant_id: str, job_id: str) -> str:
    """A job's name in the open-jobs index and in its keys (tenant ids never hold a '/')."""
    return f"{tenant_id}/{job_id}"


@contextmanager
def _decoding(job_id: str, what: str) -> Iterator[None]:
    """Decoding (no I/O inside) a part of the job's record: whatever it raises means the record
    cannot be read, for good (unlike a Redis error)."""
    try:
        yield
    except Exception as exc:
        raise JobUnreadable(f"job {job_id!r} cannot be read from the journal: its {what}") from exc


def _decoded_spec(job_id: str, submission: Submission) -> JobSpec:
    """The submission's spec (in a worker thread for a large one: only the decode's own errors
    make the job unreadable, not the thread hop's)."""
    with _decoding(job_id, "submission"):
        return submission.decoded_spec()


def _script_source(name: str) -> str:
    lua = resources.files("gateway") / "lua"
    return (lua / "_lib.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


_fails_closed = fails_closed(JournalUnavailable, "job journal")


class RedisJournal(RedisClient):
    def __init__(
        self,
        url: str,
        replica_id: str,
        *,
        lease_ttl_s: float = 10.0,
        retention_s: float = 86_400.0,
        max_ended_per_tenant: int = MAX_ENDED_PER_TENANT,
        max_ended_bytes_per_tenant: int = MAX_ENDED_BYTES_PER_TENANT,
        prefix: str = "fg",
        socket_timeout_s: float = 2.0,
        spec_cache_bytes: int = SPEC_CACHE_BYTES,
    ) -> None:
        super().__init__(url, POOL_SIZE, socket_timeout_s, socket_timeout_s)
        # the slots bound the reads to the client's connections: none waits on its pool
        self._blocking = bounded_client(url, BLOCKING_READS, socket_timeout_s, socket_timeout_s)
        # (a free slot is taken at once: a read under way when the journal closes is not refused)
        self._read_slots = anyio.Semaphore(BLOCKING_READS, fast_acquire=True)
        self.replica_id = replica_id
        self.lease_ttl_s = lease_ttl_s
        self.retention_s = retention_s
        self.max_ended_per_tenant = max_ended_per_tenant
        self.max_ended_bytes_per_tenant = max_ended_bytes_per_tenant
        self._base = f"{prefix}:{{jobs}}"
        self._index = f"{self._base}:open"
        self._scripts = {n: self._redis.register_script(_script_source(n)) for n in _SCRIPTS}
        self._specs: LRUCache[str, tuple[JobSpec, int]] = LRUCache(
            spec_cache_bytes, getsizeof=lambda entry: entry[1]
        )

    async def aclose(self) -> None:
        await super().aclose()  # waits for the blocking reads under way too
        await self._blocking.aclose()

    def _job(self, tenant_id: str, job_id: str) -> str:
        return f"{self._base}:{_member(tenant_id, job_id)}"

    def _lease_keys(self, tenant_id: str, job_id: str) -> list[str]:
        """The keys of the lease scripts (renew, hand_back, claim): the job's hash, the index."""
        return [self._job(tenant_id, job_id), self._index]

    def _ended_keys(self, tenant_id: str) -> list[str]:
        """The tenant's ended jobs and their sizes (append.lua)."""
        ended = f"{self._base}:ended:{tenant_id}"
        return [ended, f"{ended}:bytes"]

    def _log(self, tenant_id: str, job_id: str) -> str:
        return f"{self._job(tenant_id, job_id)}:log"

    def _key_records(self, tenant_id: str) -> str:
        """The prefix of the tenant's idempotency records."""
        return f"{self._base}:key:{tenant_id}:"

    def _key_record(self, tenant_id: str, key: str) -> str:
        return self._key_records(tenant_id) + hashlib.sha256(key.encode()).hexdigest()[:32]

    @property
    def _ttl_ms(self) -> int:
        return int(self.lease_ttl_s * 1000)

    async def _each(self, script: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        """One script per job (its keys and args), all in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                await self._scripts[script](keys=keys, args=args, client=pipe)
            replies: list[Any] = await pipe.execute()
        return replies

    @_fails_closed
    async def create(self, run: JobRun) -> Owned:
        """Journal a new job, owned here; raises KeyTaken when its idempotency key names a
        job already (a race between replicas the caller's own check could not see)."""
        key = run.spec.idempotency_key
        fields = [x for pair in Submission.of(run).fields().items() for x in pair]
        reply = await self._scripts["create"](
            keys=[
                self._job(run.tenant_id, run.job_id),
                self._index,
                self._key_record(run.tenant_id, key),
            ],
            args=[
                _member(run.tenant_id, run.job_id),
                self.replica_id,
                self._ttl_ms,
                1 if key else 0,
                IDEMPOTENCY_TTL_S,
                *fields,
            ],
        )
        # the key naming this very job: the script ran, its reply was lost, and this is the
        # client's retry of it (job ids are never reused)
        if reply[0] == "exists" and reply[1] != run.job_id:
            raise KeyTaken(reply[1])
        return Owned(run.tenant_id, run.job_id, 1)

    @_fails_closed
    async def job_by_key(self, tenant_id: str, key: str) -> str | None:
        """The job an idempotency key names, on any replica."""
        job_id: Any = await self._redis.get(self._key_record(tenant_id, key))
        return None if job_id is None else str(job_id)

    @_fails_closed
    async def append(self, batches: Sequence[Batch]) -> list[bool]:
        """Write each job's batch of events, all in one round trip; False for a job another
        replica owns now, or whose journal lost events this replica wrote (a gap: logged)."""
        replies = await self._each(
            "append",
            [
                (
                    [
                        self._job(b.owned.tenant_id, b.owned.job_id),
                        self._log(b.owned.tenant_id, b.owned.job_id),
                        self._index,
                        *self._ended_keys(b.owned.tenant_id),
                    ],
                    [
                        b.owned.token,
                        b.events[0].sequence,
                        _member(b.owned.tenant_id, b.owned.job_id),
                        1 if b.ended else 0,
                        int(self.retention_s),
                        self.max_ended_per_tenant,
                        self.max_ended_bytes_per_tenant,
                        f"{self._base}:",
                        b.snapshot,
                        *(encode_event(e) for e in b.events),
                    ],
                )
                for b in batches
            ],
        )
        for b, reply in zip(batches, replies, strict=True):
            if reply[0] == "gap":
                # the writer sends every event in order, so Redis lost writes it acknowledged (a
                # failover to a lagging replica, a restart that lost its last second): this copy
                # is ahead of the journal, and the job is lost here as if fenced (whoever claims
                # it next restores it from the journal)
                log.error(
                    "job %s: the journal lost its events after sequence %s (this batch starts "
                    "at %d): the job is given up here, to be taken over from the journal",
                    b.owned.job_id,
                    reply[1],
                    b.events[0].sequence,
                )
        return [reply[0] == "ok" for reply in replies]

    @_fails_closed
    async def renew(self, owned: Sequence[Owned]) -> Renewed:
        """Extend the leases of the jobs this replica owns, in one round trip."""
        replies = await self._each(
            "renew",
            [
                (
                    self._lease_keys(job.tenant_id, job.job_id),
                    [job.token, self._ttl_ms, _member(job.tenant_id, job.job_id)],
                )
                for job in owned
            ],
        )
        lost = [job for job, r in zip(owned, replies, strict=True) if r[0] == "lost"]
        asked = [job for job, r in zip(owned, replies, strict=True) if r[0] == "ok" and r[1] == "1"]
        return Renewed(lost, asked)

    @_fails_closed
    async def hand_back(self, owned: Sequence[Owned]) -> None:
        """Give the jobs up (this replica is stopping): any replica may claim them at once."""
        await self._each(
            "hand_back",
            [
                (
                    self._lease_keys(job.tenant_id, job.job_id),
                    [job.token, _member(job.tenant_id, job.job_id)],
                )
                for job in owned
            ],
        )

    @_fails_closed
    async def orphans(self, limit: int) -> list[tuple[str, str]]:
        """(tenant, job) of open jobs whose owner's lease has ended, oldest lease first."""
        seconds, micros = await self._redis.time()
        now_ms = seconds * 1000 + micros // 1000
        members: Any = await self._redis.zrangebyscore(self._index, "-inf", now_ms, 0, limit)
        # an entry that is no `<tenant>/<job>` (no script writes one: a record corrupted) names
        # no job to claim: it leaves the index, or every replica's every scan would stop at it
        garbled = [m for m in members if "/" not in m]
        if garbled:
            log.error("the open-jobs index named no job in %r: removed", garbled)
            await self._redis.zrem(self._index, *garbled)
        return [(tenant, job) for tenant, job in (m.split("/", 1) for m in members if "/" in m)]

    @_fails_closed
    async def claim(self, tenant_id: str, job_id: str) -> tuple[Owned, JobRun, bool] | None:
        """Take over an orphan: its ownership, the job as its journal has it and whether a
        cancel was asked; None when another replica claimed it first, its lease still runs,
        or it has ended (an unreadable one ends here: `_end_unreadable`)."""
        # names this claim, so that the client's retry of it (its reply lost) gets its token
        nonce = secrets.token_hex(8)
        token = await self._scripts["claim"](
            keys=self._lease_keys(tenant_id, job_id),
            args=[self.replica_id, self._ttl_ms, _member(tenant_id, job_id), nonce],
        )
        if token is None:
            return None
        owned = Owned(tenant_id, job_id, int(token))
        try:
            loaded = await self._load(tenant_id, job_id, view=False)
        except JobUnreadable as exc:
            await self._end_unreadable(owned, exc)
            return None
        if loaded is None:
            return None
        run, fields = loaded
        return owned, run, "cancel" in fields

    async def _end_unreadable(self, owned: Owned, exc: JobUnreadable) -> None:
        """A claimed job that cannot be read would fail every claim, each lease, for ever, and
        its watchers wait for its end as long: it ends FAILED (appended as its owner would, so
        its watchers see it end and it is kept for the retention of ended jobs), after its
        log's newest event (its hash's `seq` only mirrors it, and may be what is unreadable)."""
        newest: Any = await self._redis.xrevrange(self._log(owned.tenant_id, owned.job_id), count=1)
        last = int(newest[0][0].split("-")[1]) if newest else 0
        ended = JobEvent(last + 1, time.time(), JobEnded(JobState.FAILED))
        await self.append([Batch(owned, [ended], ended=True)])
        log.error("%s (tenant %r): ended FAILED", exc, owned.tenant_id, exc_info=exc)

    @_fails_closed
    async def load(self, tenant_id: str, job_id: str) -> JobRun | None:
        """The job as its journal has it, as a view: detached, since this replica does not run
        it; None when there is none. Its state is the latest snapshot's with the events after
        it replayed; it keeps no log (read the events with `read`)."""
        loaded = await self._load(tenant_id, job_id, view=True)
        return None if loaded is None else loaded[0]

    async def _load(
        self, tenant_id: str, job_id: str, *, view: bool
    ) -> tuple[JobRun, dict[str, str]] | None:
        """The job from its latest snapshot, with the events after it replayed (its log holds
        only those: `JobRun.log_start`; a view, none)."""
        key = self._job(tenant_id, job_id)
        cached = self._specs.get(key)
        fields: dict[str, str]
        if cached is None:
            fields = await self._redis.hgetall(key)  # type: ignore[assignment]
        else:
            values: list[str | None] = await self._redis.hmget(key, _READ_FIELDS)  # type: ignore[assignment]
            fields = {k: v for k, v in zip(_READ_FIELDS, values, strict=True) if v is not None}
        if not fields:
            self._specs.pop(key, None)
            return None
        with _decoding(job_id, "submission"):
            submission = Submission.from_fields(fields)
        if cached is not None:
            spec = cached[0]
        elif len(submission.spec) <= INLINE_DECODE_CHARS:
            spec = _decoded_spec(job_id, submission)
        else:
            spec = await anyio.to_thread.run_sync(_decoded_spec, job_id, submission)
        with _decoding(job_id, "submission"):
            run = submission.run(spec)
        if cached is None:
            self._keep_spec(key, spec)
        run.detached = view
        if "snapshot" in fields:
            with _decoding(job_id, "snapshot"):
                restore_snapshot(run, fields["snapshot"])
        events = await self.read(tenant_id, job_id, run.last_sequence)
        with _decoding(job_id, "events"):
            for event in events:
                run.replay(event)
        return run, fields

    def _keep_spec(self, key: str, spec: JobSpec) -> None:
        held = spec.held_bytes()
        if held <= self._specs.maxsize // SPEC_CACHE_ENTRY_PART:
            self._specs[key] = spec, held

    @_fails_closed
    async def read(
        self,
        tenant_id: str,
        job_id: str,
        after: int,
        block_s: float | None = None,
        limit: int | None = None,
    ) -> list[JobEvent]:
        """The events after sequence `after` (the first `limit` of them); with `block_s`, waits
        that long for the first (after its turn for a blocking read's connection)."""
        stream = self._log(tenant_id, job_id)
        entries: Any
        if block_s is None:
            entries = await self._redis.xrange(stream, f"0-{after + 1}", "+", count=limit)
        else:
            async with self._read_slots:
                if self.closed:  # while it waited: a connection opened now would outlive the close
                    raise JournalUnavailable("job journal unavailable")
                reply: Any = await self._blocking.xread(
                    {stream: f"0-{after}"}, count=limit, block=int(block_s * 1000)
                )
            entries = reply[0][1] if reply else []
        with _decoding(job_id, "events"):
            return [decode_event(int(eid.split("-")[1]), f["e"]) for eid, f in entries]

    @_fails_closed
    async def exists(self, tenant_id: str, job_id: str) -> bool:
        """Whether the journal still holds the job (an ended one goes after `retention_s`, or
        sooner past its tenant's bounds)."""
        return bool(await self._redis.exists(self._job(tenant_id, job_id)))

    @_fails_closed
    async def abandon(self, run: JobRun) -> None:
        """A job whose `create` may have run but whose reply never came back (its client left):
        if it was journaled, it is cancelled by whoever claims it, at once, and its idempotency
        key names it no more (the client, told it failed, retries with the key)."""
        await self._scripts["abandon"](
            keys=[
                *self._lease_keys(run.tenant_id, run.job_id),
                self._key_record(run.tenant_id, run.spec.idempotency_key),
            ],
            args=[_member(run.tenant_id, run.job_id), run.job_id],
        )

    @_fails_closed
    async def forget_tenant(self, tenant_id: str) -> None:
        """A deleted tenant's jobs, open or ended, and its idempotency records go: a tenant
        created again under the id sees none of them, and the replicas that run its open jobs
        find them gone at their next renewal and stop them. (Scans the journal's keys: a
        tenant's deletion is rare.)"""
        keys = self._ended_keys(tenant_id)
        for pattern in (self._job(tenant_id, "*"), self._key_records(tenant_id) + "*"):
            keys += [key async for key in self._redis.scan_iter(match=pattern, count=1000)]
        match = _member(tenant_id, "*")
        members = [m async for m, _ in self._redis.zscan_iter(self._index, match=match)]
        async with self._redis.pipeline(transaction=False) as pipe:
            for start in range(0, len(keys), 1000):
                pipe.unlink(*keys[start : start + 1000])
            if members:
                pipe.zrem(self._index, *members)
            await pipe.execute()

    @_fails_closed
    async def ask_cancel_of_key(self, tenant_id: str, key_id: str) -> int:
        """Ask the owners of the tenant's open jobs submitted with the key to cancel them (it was
        revoked); how many were asked."""
        match = _member(tenant_id, "*")
        members = [m async for m, _ in self._redis.zscan_iter(self._index, match=match)]
        jobs = [member.split("/", 1)[1] for member in members]
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in jobs:
                pipe.hget(self._job(tenant_id, job_id), "key_id")
            keys = await pipe.execute()
        mine = [job_id for job_id, key in zip(jobs, keys, strict=True) if key == key_id]
        asked = await self._each("cancel", [([self._job(tenant_id, j)], []) for j in mine])
        return sum(map(bool, asked))

    @_fails_closed
    async def ask_cancel(self, tenant_id: str, job_id: str) -> bool:
        """Ask the job's owner to cancel it; False when it has ended or does not exist."""
        return bool(await self._scripts["cancel"](keys=[self._job(tenant_id, job_id)]))
