"""The lease half of the quota contract (tenants/store.py): renewing reservations and job
admissions, and settles that arrive after their reservation was reclaimed. Both stores."""

from __future__ import annotations

import dataclasses

import pytest

from tenants import CallClosed, RequestInvalid
from tenants.models import CLOSED_CALL_MEMORY_S, MAX_RENEW_IDS
from tests.tenants.conftest import TTL, Harness, make_tenant

pytestmark = pytest.mark.anyio


async def reclaimed_call(h: Harness, call_id: str, tokens: int) -> None:
    """Reserve `call_id` and let its reservation expire and be reclaimed."""
    await h.store.reserve("acme", call_id, tokens, h.tiny_ttl_s)
    h.advance(2 * h.tiny_ttl_s)
    assert (await h.store.usage("acme")).active_reservations == 0


# Renew


async def test_renew_moves_the_expiry_to_now_plus_ttl(h: Harness) -> None:
    await make_tenant(h)
    first = await h.store.reserve("acme", "c1", 10, TTL)
    h.advance(1.0)
    assert await h.store.renew("acme", calls=["c1"], ttl_s=2 * TTL) == []
    renewed = await h.store.reserve("acme", "c1", 10, TTL)  # an open call answers as it is
    as_of = (await h.store.usage("acme")).as_of
    assert first.expires_at + TTL <= renewed.expires_at <= as_of + 2 * TTL
    assert renewed.tokens == 10


async def test_a_shortened_lease_runs_out(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=60)
    await h.store.reserve("acme", "c1", 40, TTL)
    await h.store.admit_job("acme", "j1", 1)
    lost = await h.store.renew("acme", calls=["c1"], jobs=["j1"], ttl_s=h.tiny_ttl_s)
    assert lost == []
    h.advance(2 * h.tiny_ttl_s)
    usage = await h.store.usage("acme")
    assert (usage.active_reservations, usage.queued_jobs, usage.tokens_today) == (0, 0, 0)
    assert await h.store.renew("acme", calls=["c1"], ttl_s=TTL) == ["c1"]


async def test_renewed_leases_outlive_their_first_ttl(h: Harness) -> None:
    clock = h.need_clock("renews before a 10 s lease runs out")
    await make_tenant(h, max_queued_jobs=1)
    await h.store.admit_job("acme", "j1", 1, ttl_s=10.0)
    await h.store.reserve("acme", "c1", 10, 10.0)
    for _ in range(5):
        clock.advance(8.0)
        assert await h.store.renew("acme", calls=["c1"], jobs=["j1"], ttl_s=10.0) == []
    usage = await h.store.usage("acme")
    assert (usage.active_reservations, usage.queued_jobs) == (1, 1)
    clock.advance(10.0)
    usage = await h.store.usage("acme")
    assert (usage.active_reservations, usage.queued_jobs) == (0, 0)


async def test_renew_names_the_calls_whose_lease_was_lost(h: Harness) -> None:
    await make_tenant(h)
    await make_tenant(h, "beta")
    await reclaimed_call(h, "expired", 10)
    for call_id in ("open", "settled", "released"):
        await h.store.reserve("acme", call_id, 10, TTL)
    await h.store.settle("acme", "settled", 1, 1)
    await h.store.release("acme", "released")
    await h.store.reserve("beta", "theirs", 10, TTL)
    named = ["open", "settled", "released", "expired", "unknown", "theirs"]
    lost = await h.store.renew("acme", calls=named, ttl_s=TTL)
    assert lost == ["settled", "released", "expired", "unknown", "theirs"]
    assert (await h.store.usage("acme")).active_reservations == 1
    assert (await h.store.usage("beta")).active_reservations == 1
    assert (await h.store.reserve("acme", "unknown", 10, TTL)).tokens == 10  # renew closes nothing
    assert await h.store.renew("ghost", calls=["a", "b"], ttl_s=TTL) == ["a", "b"]
    assert await h.store.renew("acme", ttl_s=TTL) == []


async def test_renew_admits_no_job(h: Harness) -> None:
    await make_tenant(h, max_queued_jobs=2)
    await h.store.admit_job("acme", "expired", 1, ttl_s=h.tiny_ttl_s)
    await h.store.admit_job("acme", "finished", 1)
    await h.store.finish_job("acme", "finished")
    h.advance(2 * h.tiny_ttl_s)
    assert await h.store.renew("acme", jobs=["expired", "finished", "unknown"], ttl_s=TTL) == []
    assert (await h.store.usage("acme")).queued_jobs == 0
    assert await h.store.admit_job("acme", "expired", 1) is True


async def test_renew_bounds_its_arguments(h: Harness) -> None:
    await make_tenant(h)
    too_many = [f"c{i}" for i in range(MAX_RENEW_IDS + 1)]
    for bad in (
        {"calls": too_many},
        {"jobs": too_many},
        {"calls": "c1"},
        {"calls": [""]},
        {"jobs": ["x" * 257]},
    ):
        with pytest.raises(RequestInvalid):
            await h.store.renew("acme", **bad, ttl_s=TTL)
    with pytest.raises(RequestInvalid):
        await h.store.renew("acme", calls=["c1"], ttl_s=0.0)
    most = too_many[:MAX_RENEW_IDS]
    assert await h.store.renew("acme", calls=most, jobs=most, ttl_s=TTL) == most


# Late settles


async def test_a_late_settle_charges_its_actual_tokens_once(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=60, daily_token_budget=1000)
    reserved_at = (await h.store.usage("acme")).as_of
    await reclaimed_call(h, "late", 40)
    refunded = await h.store.usage("acme")
    assert refunded.tokens_today == 0
    assert refunded.bucket_level == pytest.approx(60.0)

    assert await h.store.settle("acme", "late", 12, 8) is True
    usage = await h.store.usage("acme")
    assert (usage.input_tokens, usage.output_tokens, usage.settled_calls) == (12, 8, 1)
    assert (usage.tokens_today, usage.active_reservations) == (20, 0)
    assert usage.bucket_level is not None
    assert 40 - 1e-6 <= usage.bucket_level <= 40 + (usage.as_of - reserved_at) + 1e-6

    assert await h.store.settle("acme", "late", 12, 8) is False
    assert await h.store.release("acme", "late") is False
    again = await h.store.usage("acme")
    assert (again.input_tokens, again.settled_calls, again.tokens_today) == (12, 1, 20)
    with pytest.raises(CallClosed):
        await h.store.reserve("acme", "late", 40, TTL)


async def test_a_late_settle_is_billed_past_the_limits(h: Harness) -> None:
    """Use that happened is charged even when the budget was spent meanwhile."""
    await make_tenant(h, daily_token_budget=100, max_queued_jobs=1)
    await h.store.admit_job("acme", "j1", 1)
    await reclaimed_call(h, "late", 100)
    await h.store.reserve("acme", "next", 100, TTL)
    assert await h.store.settle("acme", "late", 70, 30, finish_job="j1") is True
    usage = await h.store.usage("acme")
    assert (usage.tokens_today, usage.settled_calls, usage.queued_jobs) == (200, 1, 0)


async def test_a_release_after_reclaim_changes_nothing(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=60, daily_token_budget=1000)
    await reclaimed_call(h, "lost", 40)
    before = await h.store.usage("acme")
    assert await h.store.release("acme", "lost") is False
    after = await h.store.usage("acme")
    assert dataclasses.replace(after, as_of=before.as_of) == before
    assert await h.store.settle("acme", "lost", 5, 5) is True  # its late settle may still come
    assert (await h.store.usage("acme")).tokens_today == 10


async def test_a_reclaimed_call_is_remembered_for_the_closed_call_memory(h: Harness) -> None:
    clock = h.need_clock("waits out the closed-call memory")
    await make_tenant(h)
    await reclaimed_call(h, "forgotten", 10)
    await reclaimed_call(h, "remembered", 10)
    clock.advance(CLOSED_CALL_MEMORY_S - 1.0)
    assert await h.store.settle("acme", "remembered", 1, 1) is True
    clock.advance(1.0)
    assert await h.store.settle("acme", "forgotten", 1, 1) is False
    assert (await h.store.usage("acme")).settled_calls == 1
