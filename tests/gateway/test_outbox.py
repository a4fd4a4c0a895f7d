"""The settle outbox: closes that cannot reach the store wait, on disk, and land exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.outbox import Close, Outbox
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
