"""The settle outbox: quota closes that could not reach the store wait here and land exactly once.

A finished call's settle (and a release, and a job's finish) goes to the store at once. When the
store cannot be reached, the close is appended to a local file (one JSON line, fsynced) and kept
in memory; a retry task sends the pending closes again with capped exponential backoff until
each lands, then appends a `done` line for it; once nothing is pending, or the landed closes'
lines pass `STALE_LINES`, the file is rewritten with just the pending ones (one write to the file
at a time: an append during a rewrite would go to the file it replaces). On start, the file's
closes without a `done` line are pending again (the previous process died with them), and the
file is rewritten with just those. Closes are idempotent by call id and job id in the store, so
a close that landed but whose reply was lost is harmless to send again: exactly once follows.
Without a file (the in-memory store, which dies with the process anyway) pending closes live in
memory only.

Invariant: every close handed to `send` either landed (its result returned), or is pending in
memory and, with a file, on disk until it lands (unless the disk refuses the write: that is
logged). One process holds a file at a time (an exclusive lock beside it).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal

import anyio
from anyio.abc import TaskGroup

from gateway.owned import OwnsTasks
from tenants import QuotaStore, QuotaUnavailable

log = logging.getLogger(__name__)
Op = Literal["settle", "release", "finish_job"]
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0
# the file is rewritten with just the pending closes once it holds this many lines of closes
# that landed (or 4 for each pending one, if more): bounded by what waits, not by how long the
# store has been flaky
STALE_LINES = 256


@dataclass(frozen=True, slots=True)
class Close:
    """One quota close: a call's settle or release, or a job's finish."""

    op: Op
    tenant_id: str
    subject: str  # the call id, or the job id for finish_job
    input_tokens: int = 0
    output_tokens: int = 0
    finish_job: str | None = None  # settle: the job finished in the same step

    @property
    def key(self) -> str:
        return f"{self.op} {self.tenant_id} {self.subject}"


class Outbox(OwnsTasks):
    def __init__(self, store: QuotaStore, path: Path | None = None) -> None:
        super().__init__()
        self.store = store
        self.path = path
        self._pending: dict[str, Close] = {}
        self._wake = anyio.Event()
        self._drained = anyio.Event()
        self._drained.set()
        self._lock: IO[bytes]  # the file's lock, held while the outbox is open
        # one write to the file at a time: an append while the file is rewritten would land
        # in the file the rewrite replaces, and be lost to a crash
        self._writing = anyio.Lock()
        self._stale = 0  # lines of the file that name no pending close
        self._torn = False  # a write failed: the file is rewritten whole before it is written

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        if self.path is not None:
            await anyio.to_thread.run_sync(self._recover)
            stack.callback(self._lock.close)

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._retry_loop)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def wait_drained(self) -> None:
        """Return once nothing is pending (for tests and shutdown)."""
        await self._drained.wait()

    async def wait_pending(self) -> None:
        """Return once a close waits here (for tests)."""
        while not self._pending:
            await self._wake.wait()

    async def send(self, close: Close) -> bool | None:
        """Apply the close now: the store's answer, or None when it waits in the outbox."""
        try:
            return await self._apply(close)
        except QuotaUnavailable:
            await self._defer(close)
            return None

    async def _apply(self, close: Close) -> bool:
        if close.op == "settle":
            return await self.store.settle(
                close.tenant_id,
                close.subject,
                close.input_tokens,
                close.output_tokens,
                finish_job=close.finish_job,
            )
        if close.op == "release":
            return await self.store.release(close.tenant_id, close.subject)
        return await self.store.finish_job(close.tenant_id, close.subject)

    async def _defer(self, close: Close) -> None:
        if close.key in self._pending:
            return
        self._pending[close.key] = close
        self._drained = anyio.Event() if self._drained.is_set() else self._drained
        self._wake.set()
        await self._write(functools.partial(self._append, _close_line(close)))

    async def _retry_loop(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            if not self._pending:
                self._drained.set()
                self._wake = anyio.Event()
                await self._wake.wait()
                delay = RETRY_FIRST_S
                continue
            landed = await self._retry_once()
            delay = RETRY_FIRST_S if landed else min(delay * 2, RETRY_MAX_S)
            if self._pending:
                await anyio.sleep(delay)

    async def _retry_once(self) -> bool:
        """Send every pending close once; True when at least one landed."""
        landed = False
        for key, close in list(self._pending.items()):
            try:
                await self._apply(close)
            except QuotaUnavailable:
                return landed
            except Exception:  # a close the store refuses for good (its tenant deleted...)
                log.exception("dropping quota close %s", key)
            del self._pending[key]
            landed = True
            await self._write(functools.partial(self._append, json.dumps({"done": key})))
            self._stale += 2  # the close's line and its `done`
        if not self._pending or self._stale > max(STALE_LINES, 4 * len(self._pending)):
            await self._write(self._compact)
        return landed

    async def _write(self, write: Callable[[], None]) -> None:
        """Write to the file in a worker thread, one write at a time; a disk that fails is
        logged, and the closes stay pending in memory (they still land while this process
        lives)."""
        if self.path is None:
            return
        async with self._writing:
            try:
                # after a failed write the file may end in part of a line: the next line
                # appended would join it, and both be unreadable at the next start
                await anyio.to_thread.run_sync(self._compact if self._torn else write)
                self._torn = False
            except OSError:
                self._torn = True
                log.exception("cannot write the outbox file %s", self.path)

    def _compact(self) -> None:
        """Rewrite the file with the closes pending (run while no other write is under way)."""
        self._rewrite([_close_line(close) for close in list(self._pending.values())])
        self._stale = 0

    def _append(self, line: str) -> None:
        assert self.path is not None
        with self.path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    def _rewrite(self, lines: list[str]) -> None:
        """Replace the file with `lines` (atomically)."""
        assert self.path is not None
        temp = self.path.with_name(self.path.name + ".tmp")
        with temp.open("w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in lines)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, self.path)

    def _recover(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = _lock(self.path)
        if self.path.exists():
            for close in _read_pending(self.path):
                self._pending[close.key] = close
        self._compact()
        if self._pending:
            log.warning("%d quota closes pending from %s", len(self._pending), self.path)
            self._drained = anyio.Event()


def _close_line(close: Close) -> str:
    return json.dumps({"close": asdict(close)})


class OutboxInUse(RuntimeError):
    """Another process holds this outbox file: two gateways must not share one."""


def _lock(path: Path) -> IO[bytes]:
    """An exclusive lock on `<path>.lock`, held while the returned file stays open."""
    holder = path.with_name(path.name + ".lock").open("ab")
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder.close()
        raise OutboxInUse(
            f"the outbox file {path} is in use by another gateway: give each its own outbox_file"
        ) from None
    return holder


def _read_pending(path: Path) -> list[Close]:
    """The closes of an outbox file without a `done` line; a torn last line is skipped."""
    pending: dict[str, Close] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "close" in entry:
            close = Close(**entry["close"])
            pending[close.key] = close
        elif "done" in entry:
            pending.pop(entry["done"], None)
    return list(pending.values())
