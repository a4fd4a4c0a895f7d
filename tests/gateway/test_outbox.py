"""The settle outbox: closes that cannot reach the store wait, on disk, and land exactly once."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import anyio
import pytest

import gateway.outbox as outbox_module
from gateway.outbox import STALE_LINES, Close, Outbox, _read_pending
from tenants import MemoryQuotaStore, QuotaUnavailable, TenantQuota

pytestmark = pytest.mark.anyio


class SwitchedStore(MemoryQuotaStore):
    """The in-memory store with a switch that makes every settle and release unreachable."""

    down = False

    async def settle(self, tenant_id: str, call_id: str, *args: int, **kwargs: str | None) -> bool:
        if self.down:
            raise QuotaUnavailable("quota store unavailable")
        return await super().settle(tenant_id, call_id, *args, **kwargs)  # type: ignore[arg-type]


async def reserved(store: MemoryQuotaStore, *call_ids: str) -> None:
    await store.create_tenant("acme", "Acme", TenantQuota())
    for call_id in call_ids:
        await store.reserve("acme", call_id, 100, 60.0)


async def test_a_settle_that_cannot_land_waits_on_disk_then_lands_once(tmp_path: Path) -> None:
    store, path = SwitchedStore(), tmp_path / "outbox.jsonl"
    await reserved(store, "c1")
    store.down = True
    async with Outbox(store, path) as outbox:
        assert await outbox.send(Close("settle", "acme", "c1", 10, 5)) is None
        assert await outbox.send(Close("settle", "acme", "c1", 10, 5)) is None  # no duplicate
        assert outbox.pending == 1 and "c1" in path.read_text()
        store.down = False
        await outbox.wait_drained()
    usage = await store.usage("acme")
    assert (usage.input_tokens, usage.output_tokens, usage.settled_calls) == (10, 5, 1)
    assert path.read_text() == ""  # rewritten once nothing was pending


async def test_closes_left_by_a_dead_process_land_at_start(tmp_path: Path) -> None:
    store, path = SwitchedStore(), tmp_path / "outbox.jsonl"
    await reserved(store, "c1", "c2", "c3")
    lines = [
        {"close": {"op": "settle", "tenant_id": "acme", "subject": "c1", "input_tokens": 7,
                   "output_tokens": 3, "finish_job": None}},
        {"close": {"op": "settle", "tenant_id": "acme", "subject": "c2", "input_tokens": 9,
                   "output_tokens": 9, "finish_job": None}},
        {"done": "settle acme c2"},  # landed before the process died
        {"close": {"op": "release", "tenant_id": "acme", "subject": "c3", "input_tokens": 0,
                   "output_tokens": 0, "finish_job": None}},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"close": {"op"')
    async with Outbox(store, path) as outbox:
        await outbox.wait_drained()
    usage = await store.usage("acme")
    assert (usage.input_tokens, usage.output_tokens, usage.settled_calls) == (7, 3, 1)
    assert usage.active_reservations == 1  # c2: its settle had landed, so it is not sent again
    assert path.read_text() == ""


class ReleaseSwitchedStore(MemoryQuotaStore):
    down = False

    async def release(self, tenant_id: str, call_id: str) -> bool:
        if self.down:
            raise QuotaUnavailable("quota store unavailable")
        return await super().release(tenant_id, call_id)


async def test_a_close_deferred_while_the_file_is_rewritten_stays_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its line went to the file the rewrite was about to replace: pending in memory only, and
    lost to a crash, though `send` had said it waited on disk."""
    store, path = ReleaseSwitchedStore(), tmp_path / "outbox.jsonl"
    await reserved(store, "c1", "c2")
    at_rename, go = threading.Event(), threading.Event()
    rename = os.replace

    def held_rename(source: Path, target: Path) -> None:
        if Path(target) == path:
            at_rename.set()
            go.wait(10)
        rename(source, target)

    async with Outbox(store, path) as outbox:
        monkeypatch.setattr(outbox_module.os, "replace", held_rename)
        store.down = True
        assert await outbox.send(Close("release", "acme", "c1")) is None
        store.down = False  # c1 lands, and the file is rewritten: held at its rename
        await anyio.to_thread.run_sync(at_rename.wait, 10)
        store.down = True
        async with anyio.create_task_group() as tg:
            tg.start_soon(outbox.send, Close("release", "acme", "c2"))
            await anyio.wait_all_tasks_blocked()
            go.set()
        assert [close.subject for close in _read_pending(path)] == ["c2"]
        store.down = False
        await outbox.wait_drained()


class OnceFailingStore(MemoryQuotaStore):
    """Each release fails its first try; the one retried lets the next call's close come in
    (and fail its first try): a store that keeps failing now and then under steady load."""

    def __init__(self, outbox_file: Path, calls: int) -> None:
        super().__init__()
        self.outbox_file, self.calls = outbox_file, calls
        self.tried: set[str] = set()
        self.most_lines = 0
        self.outbox: Outbox

    async def release(self, tenant_id: str, call_id: str) -> bool:
        self.most_lines = max(self.most_lines, self.outbox_file.read_text().count("\n"))
        if call_id not in self.tried:
            self.tried.add(call_id)
            raise QuotaUnavailable("quota store unavailable")
        following = int(call_id[1:]) + 1
        if following < self.calls:
            await self.outbox.send(Close("release", tenant_id, f"c{following}"))
        return await super().release(tenant_id, call_id)


async def test_the_file_holds_what_is_pending_not_every_close_since_the_store_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was rewritten only once nothing was pending: under a store that keeps failing now and
    then, it kept every close that landed, and its `done` line, for as long as that lasted."""
    monkeypatch.setattr(outbox_module, "RETRY_FIRST_S", 0.0)
    calls, path = 2 * STALE_LINES, tmp_path / "outbox.jsonl"
    store = OnceFailingStore(path, calls)
    await store.create_tenant("acme", "Acme", TenantQuota(max_concurrent_calls=0))
    for i in range(calls):
        await store.reserve("acme", f"c{i}", 1, 600.0)
    async with Outbox(store, path) as outbox:
        store.outbox = outbox
        assert await outbox.send(Close("release", "acme", "c0")) is None
        await outbox.wait_drained()
    assert (await store.usage("acme")).active_reservations == 0
    assert store.most_lines <= STALE_LINES + 8


async def test_a_close_after_a_write_the_disk_cut_short_stays_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk cut a line short; the next close was appended to the fragment, fsynced and
    reported waiting on disk, yet a restart could not read it: its settle was lost."""
    store, path = SwitchedStore(), tmp_path / "outbox.jsonl"
    await reserved(store, "c1", "c2")
    store.down = True
    append = Outbox._append

    def cut_short(self: Outbox, line: str) -> None:
        with path.open("a", encoding="utf-8") as out:
            out.write(line[:20])
        raise OSError(errno.ENOSPC, "No space left on device")

    async with Outbox(store, path) as outbox:
        monkeypatch.setattr(Outbox, "_append", cut_short)
        assert await outbox.send(Close("settle", "acme", "c1", 1, 1)) is None
        monkeypatch.setattr(Outbox, "_append", append)  # room again
        assert await outbox.send(Close("settle", "acme", "c2", 7, 3)) is None
        assert sorted(c.subject for c in _read_pending(path)) == ["c1", "c2"]
        store.down = False
        await outbox.wait_drained()
