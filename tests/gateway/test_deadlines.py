"""The deadline timer: due jobs are reported once, discarded ones never, and deadlines discarded
behind an earlier live one do not pile up (a tenant submitting jobs with far deadlines and
cancelling them at once)."""

from __future__ import annotations

import anyio
import pytest

from gateway.deadlines import Deadlines

pytestmark = pytest.mark.anyio


async def test_discarded_deadlines_behind_a_live_one_do_not_pile_up() -> None:
    now = [0.0]
    expired: list[str] = []
    done = anyio.Event()

    def on_expired(job_id: str) -> None:
        expired.append(job_id)
        if job_id == "last":
            done.set()

    deadlines = Deadlines(lambda: now[0], on_expired)
    deadlines.add("early", 10.0)
    for i in range(10_000):
        deadlines.add(f"far-{i}", 1e9 + i)
        deadlines.discard(f"far-{i}")
    assert len(deadlines._heap) <= 2 * len(deadlines) + 64  # the bound, not 10,001 entries
    deadlines.add("kept", 20.0)
    deadlines.add("last", 30.0)
    now[0] = 40.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(deadlines.run)
        with anyio.fail_after(5):
            await done.wait()
        tg.cancel_scope.cancel()
    assert expired == ["early", "kept", "last"]
    assert len(deadlines) == 0


async def test_a_deadline_added_again_is_moved_reported_once_at_its_latest() -> None:
    """A job's fencing deadline moves at each renewal: the earlier ones never fire, and do not
    pile up in the heap."""
    now = [0.0]
    expired: list[tuple[str, float]] = []
    done = anyio.Event()

    def on_expired(job_id: str) -> None:
        expired.append((job_id, now[0]))
        done.set()

    deadlines = Deadlines(lambda: now[0], on_expired)
    for at in range(1, 10_001):
        deadlines.add("renewed", float(at))
    assert len(deadlines._heap) <= 2 * len(deadlines) + 64
    async with anyio.create_task_group() as tg:
        tg.start_soon(deadlines.run)
        now[0] = 9_999.0
        await anyio.wait_all_tasks_blocked()
        assert not expired
        now[0] = 10_000.0
        deadlines.add("other", 20_000.0)  # wakes the timer, which sees the clock moved
        with anyio.fail_after(5):
            await done.wait()
        tg.cancel_scope.cancel()
    assert expired == [("renewed", 10_000.0)]
