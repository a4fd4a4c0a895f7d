"""The quota store contract (tenants/store.py), run on the in-memory twin and on real Redis."""

from __future__ import annotations

import pytest
from redis import Redis as SyncRedis

from tenants import (
    AuthFailed,
    CallClosed,
    KeyOfAnotherTenant,
    KeysFull,
    QuotaExceeded,
    QuotaLimit,
    QuotaUnavailable,
    RedisQuotaStore,
    RequestInvalid,
    TenantExists,
    TenantInvalid,
    TenantNotFound,
    TenantQuota,
    hash_key,
)
from tenants.models import BUSY_RETRY_S, DAY_S, MAX_KEYS_PER_TENANT
from tenants.redis_client import round_trips
from tests.tenants.conftest import REDIS_URL, TTL, Harness, make_tenant

pytestmark = pytest.mark.anyio


async def refused(h: Harness, tenant_id: str, call_id: str, tokens: int) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as caught:
        await h.store.reserve(tenant_id, call_id, tokens, TTL)
    return caught.value


# Registry


async def test_tenant_lifecycle(h: Harness) -> None:
    quota = TenantQuota(weight=2.5, tokens_per_minute=600, max_concurrent_calls=3)
    created = await h.store.create_tenant("acme", "Acme Corp", quota)
    assert (created.tenant_id, created.display_name, created.quota) == ("acme", "Acme Corp", quota)
    assert await h.store.get_tenant("acme") == created
    await h.store.create_tenant("beta", "Beta", TenantQuota())
    assert [t.tenant_id for t in await h.store.list_tenants()] == ["acme", "beta"]
    with pytest.raises(TenantExists):
        await h.store.create_tenant("acme", "Again", TenantQuota())

    new_quota = TenantQuota(weight=1.0, daily_token_budget=10)
    updated = await h.store.update_tenant("acme", quota=new_quota)
    assert (updated.display_name, updated.quota) == ("Acme Corp", new_quota)
    renamed = await h.store.update_tenant("acme", display_name="ACME")
    assert (renamed.display_name, renamed.quota, renamed.created_at) == (
        "ACME",
        new_quota,
        created.created_at,
    )
    assert await h.store.get_tenant("acme") == renamed

    await h.store.delete_tenant("acme")
    with pytest.raises(TenantNotFound):
        await h.store.get_tenant("acme")
    assert [t.tenant_id for t in await h.store.list_tenants()] == ["beta"]


async def test_tenants_are_listed_a_page_at_a_time(h: Harness) -> None:
    """A page is read alone (ListTenants read every tenant for each page: 10,000 tenants took
    seconds of the event loop a page)."""
    for tenant_id in ("delta", "acme", "charlie", "bravo", "echo"):
        await h.store.create_tenant(tenant_id, "", TenantQuota())
    await h.store.delete_tenant("charlie")

    async def ids(after: str, limit: int) -> list[str]:
        return [t.tenant_id for t in await h.store.list_tenants(after, limit)]

    assert await ids("", 2) == ["acme", "bravo"]
    assert await ids("bravo", 2) == ["delta", "echo"]  # past the deleted one
    assert await ids("b", 0) == ["bravo", "delta", "echo"]
    assert await ids("echo", 2) == []


async def test_a_tenants_keys_are_its_own_through_issue_revoke_and_delete(h: Harness) -> None:
    for tenant_id in ("acme", "beta"):
        await h.store.create_tenant(tenant_id, "", TenantQuota())
    kept, _ = await h.store.issue_key("acme")
    revoked, _ = await h.store.issue_key("acme")
    other, _ = await h.store.issue_key("beta")
    assert await h.store.revoke_key("acme", revoked) is True
    assert [k.key_id for k in await h.store.list_keys("acme")] == [kept]
    await h.store.delete_tenant("acme")
    await h.store.create_tenant("acme", "", TenantQuota())  # anew: none of the old keys
    assert await h.store.list_keys("acme") == []
    assert [k.key_id for k in await h.store.list_keys("beta")] == [other]


async def test_a_tenant_holds_at_most_its_live_keys(h: Harness) -> None:
    """Every view of a tenant lists all its keys: issued without end, they passed any reply's
    size limit and the tenant could no longer be shown or listed."""
    await h.store.create_tenant("acme", "", TenantQuota())
    issued = [(await h.store.issue_key("acme"))[0] for _ in range(MAX_KEYS_PER_TENANT)]
    with pytest.raises(KeysFull, match="revoke one first"):
        await h.store.issue_key("acme")
    assert len(await h.store.list_keys("acme")) == MAX_KEYS_PER_TENANT
    assert await h.store.revoke_key("acme", issued[0]) is True
    await h.store.issue_key("acme")  # room again


async def test_missing_and_invalid_tenants(h: Harness) -> None:
    for bad_id in ("", "a{b}", "has space", "x" * 65, "-lead"):
        with pytest.raises(TenantInvalid):
            await h.store.create_tenant(bad_id, "Bad", TenantQuota())
    with pytest.raises(TenantNotFound):
        await h.store.update_tenant("ghost", display_name="G")
    with pytest.raises(TenantNotFound):
        await h.store.delete_tenant("ghost")
    with pytest.raises(TenantNotFound):
        await h.store.reserve("ghost", "c1", 1, TTL)
    with pytest.raises(TenantNotFound):
        await h.store.usage("ghost")
    with pytest.raises(TenantNotFound):
        await h.store.admit_job("ghost", "j1", 1)
    with pytest.raises(TenantNotFound):
        await h.store.issue_key("ghost")
    assert await h.store.settle("ghost", "c1", 1, 1) is False
    assert await h.store.release("ghost", "c1") is False
    assert await h.store.finish_job("ghost", "j1") is False


async def test_delete_tenant_removes_keys_and_state(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=1000)
    _, plaintext = await h.store.issue_key("acme")
    await h.store.reserve("acme", "c1", 100, TTL)
    await h.store.settle("acme", "c1", 10, 10)
    await h.store.reserve("acme", "c2", 100, TTL)
    await h.store.admit_job("acme", "j1", 2)
    await h.store.delete_tenant("acme")
    with pytest.raises(AuthFailed):
        await h.store.authenticate(plaintext)
    assert await h.store.release("acme", "c2") is False
    await make_tenant(h, tokens_per_minute=1000)
    usage = await h.store.usage("acme")
    assert (usage.settled_calls, usage.tokens_today, usage.active_reservations) == (0, 0, 0)
    assert (usage.queued_jobs, usage.bucket_level) == (0, 1000.0)
    assert await h.store.list_keys("acme") == []


# API keys


async def test_keys_authenticate_until_revoked(h: Harness) -> None:
    await make_tenant(h)
    await make_tenant(h, "beta")
    key_id, plaintext = await h.store.issue_key("acme")
    other_id, other = await h.store.issue_key("beta")
    assert plaintext.startswith(f"fg_{key_id}_")
    assert await h.store.authenticate(plaintext) == "acme"
    assert await h.store.authenticate(other) == "beta"
    assert [k.key_id for k in await h.store.list_keys("acme")] == [key_id]

    forged = plaintext[:-4] + ("AAAA" if not plaintext.endswith("AAAA") else "BBBB")
    for bad in (forged, "", "Bearer " + plaintext, plaintext + "x", f"fg_{other_id}_{'a' * 43}"):
        with pytest.raises(AuthFailed):
            await h.store.authenticate(bad)

    assert await h.store.revoke_key("acme", key_id) is True
    assert await h.store.revoke_key("acme", key_id) is False
    with pytest.raises(AuthFailed):
        await h.store.authenticate(plaintext)
    assert await h.store.list_keys("acme") == []
    assert await h.store.authenticate(other) == "beta"


async def test_a_key_is_revoked_only_with_its_own_tenant(h: Harness) -> None:
    await make_tenant(h)
    await make_tenant(h, "beta")
    key_id, plaintext = await h.store.issue_key("acme")
    with pytest.raises(KeyOfAnotherTenant):
        await h.store.revoke_key("beta", key_id)
    assert await h.store.authenticate(plaintext) == "acme"
    assert [k.key_id for k in await h.store.list_keys("acme")] == [key_id]
    assert await h.store.revoke_key("ghost", "0123456789abcdef") is False
    for bad in ("", "0123456789ABCDEF", "0123456789abcdef0", "x" * 100_000):
        with pytest.raises(RequestInvalid):
            await h.store.revoke_key("acme", bad)
    assert await h.store.authenticate(plaintext) == "acme"


# Reservations


async def test_reserve_is_idempotent_by_call_id(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=60, daily_token_budget=1000)
    first = await h.store.reserve("acme", "c1", 40, TTL)
    again = await h.store.reserve("acme", "c1", 25, TTL)
    assert again == first
    assert first.tokens == 40
    usage = await h.store.usage("acme")
    assert (usage.active_reservations, usage.reserved_tokens, usage.tokens_today) == (1, 40, 40)
    assert usage.bucket_level is not None
    reserved_at = first.expires_at - TTL
    assert usage.bucket_level == pytest.approx(20 + (usage.as_of - reserved_at), abs=1e-6)


async def test_settle_charges_actual_once(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=60, daily_token_budget=1000)
    reservation = await h.store.reserve("acme", "c1", 50, TTL)
    h.advance(0.25)
    assert await h.store.settle("acme", "c1", 12, 8) is True
    assert await h.store.settle("acme", "c1", 12, 8) is False
    assert await h.store.release("acme", "c1") is False
    usage = await h.store.usage("acme")
    assert (usage.input_tokens, usage.output_tokens, usage.settled_calls) == (12, 8, 1)
    assert (usage.tokens_today, usage.active_reservations, usage.reserved_tokens) == (20, 0, 0)
    elapsed = usage.as_of - (reservation.expires_at - TTL)
    assert elapsed > 0
    assert usage.bucket_level == pytest.approx(min(60, 40 + elapsed), abs=1e-6)
    with pytest.raises(CallClosed):
        await h.store.reserve("acme", "c1", 50, TTL)


async def test_settle_above_reservation_charges_the_excess(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=60, daily_token_budget=1000)
    reservation = await h.store.reserve("acme", "c1", 30, TTL)
    assert await h.store.settle("acme", "c1", 30, 20) is True
    usage = await h.store.usage("acme")
    assert usage.tokens_today == 50
    elapsed = usage.as_of - (reservation.expires_at - TTL)
    assert usage.bucket_level == pytest.approx(10 + elapsed, abs=1e-6)


async def test_counts_up_to_2_pow_31_are_kept_whole_and_past_it_refused(h: Harness) -> None:
    """Redis' Lua adds counts in doubles: a reservation of 2**53 tokens beside one of 1 made
    2**53 (1 + 2**53 rounds), where the twin kept 2**53 + 1. A request's count is at most
    2**31 - 1, which no day's sum of them takes past 2**53."""
    await make_tenant(h, tokens_per_minute=0)
    await h.store.reserve("acme", "c0", 1, TTL)
    await h.store.reserve("acme", "c1", 2**31 - 1, TTL)
    assert (await h.store.usage("acme")).reserved_tokens == 2**31
    assert await h.store.settle("acme", "c1", 2**31 - 1, 5) is True
    usage = await h.store.usage("acme")
    assert (usage.input_tokens, usage.output_tokens, usage.settled_calls) == (2**31 - 1, 5, 1)
    assert usage.tokens_today == 2**31 + 5
    for count in (2**31, 2**53):
        with pytest.raises(RequestInvalid, match="2\\*\\*31 - 1"):
            await h.store.reserve("acme", "c2", count, TTL)
        with pytest.raises(RequestInvalid, match="2\\*\\*31 - 1"):
            await h.store.settle("acme", "c0", count, 0)


async def test_release_refunds_everything_once(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=60, daily_token_budget=1000)
    await h.store.reserve("acme", "c1", 50, TTL)
    assert await h.store.release("acme", "c1") is True
    assert await h.store.release("acme", "c1") is False
    assert await h.store.settle("acme", "c1", 1, 1) is False
    usage = await h.store.usage("acme")
    assert (usage.tokens_today, usage.settled_calls, usage.active_reservations) == (0, 0, 0)
    assert usage.bucket_level == pytest.approx(60.0)
    with pytest.raises(CallClosed):
        await h.store.reserve("acme", "c1", 50, TTL)


async def test_closing_an_unknown_call_stops_a_late_reserve(h: Harness) -> None:
    """A cancelled reserve may reach the store after the caller's cleanup release."""
    await make_tenant(h)
    assert await h.store.release("acme", "late") is False
    with pytest.raises(CallClosed):
        await h.store.reserve("acme", "late", 10, TTL)
    assert await h.store.settle("acme", "late-too", 1, 1) is False
    with pytest.raises(CallClosed):
        await h.store.reserve("acme", "late-too", 10, TTL)
    assert (await h.store.usage("acme")).active_reservations == 0


async def test_concurrent_call_limit(h: Harness) -> None:
    await make_tenant(h, max_concurrent_calls=2)
    await h.store.reserve("acme", "c1", 10, TTL)
    await h.store.reserve("acme", "c2", 10, TTL)
    error = await refused(h, "acme", "c3", 10)
    assert error.limit is QuotaLimit.CONCURRENT_CALLS
    assert (error.reason, error.subject) == ("QUOTA_CONCURRENT_CALLS", "tenant:acme")
    assert (error.allowed, error.requested, error.retry_after_s) == (2, 3, BUSY_RETRY_S)
    assert await h.store.reserve("acme", "c1", 10, TTL)  # an open call is not a new one
    await h.store.settle("acme", "c1", 5, 5)
    assert (await h.store.reserve("acme", "c3", 10, TTL)).tokens == 10


async def test_token_rate_refusal_says_when_to_retry(h: Harness) -> None:
    rate = 6_000  # 100 tokens per second
    await make_tenant(h, tokens_per_minute=rate)
    await h.store.reserve("acme", "c1", rate - 50, TTL)
    error = await refused(h, "acme", "c2", 80)
    usage = await h.store.usage("acme")
    assert error.limit is QuotaLimit.TOKEN_RATE
    assert (error.reason, error.allowed, error.requested) == ("QUOTA_TOKEN_RATE", rate, 80)
    assert error.retry_after_s is not None
    assert usage.bucket_level is not None
    # the level when refused lies between 50 and the level read just after
    assert (80 - usage.bucket_level) * 60 / rate <= error.retry_after_s <= 30 * 60 / rate
    assert "6000 per minute" in error.description
    too_big = await refused(h, "acme", "c3", rate + 1)
    assert too_big.retry_after_s is None
    assert (await h.store.usage("acme")).active_reservations == 1


async def test_bucket_refills_continuously(h: Harness) -> None:
    rate = 60_000_000  # a million tokens per second: microseconds show
    await make_tenant(h, tokens_per_minute=rate)
    reservation = await h.store.reserve("acme", "drain", rate, TTL)
    h.advance(0.000_25)
    first = await h.store.usage("acme")
    h.advance(0.000_5)
    second = await h.store.usage("acme")
    assert first.bucket_level is not None and second.bucket_level is not None
    assert second.as_of > first.as_of > reservation.expires_at - TTL
    per_second = rate / 60
    since_drain = first.as_of - (reservation.expires_at - TTL)
    assert first.bucket_level == pytest.approx(since_drain * per_second, abs=1e-3)
    refill = (second.as_of - first.as_of) * per_second
    assert second.bucket_level - first.bucket_level == pytest.approx(refill, abs=1e-3)


async def test_bucket_refill_admits_after_the_hinted_wait(h: Harness) -> None:
    clock = h.need_clock("waits 30 s of refill")
    await make_tenant(h, tokens_per_minute=600)
    await h.store.reserve("acme", "c1", 600, TTL)
    error = await refused(h, "acme", "c2", 300)
    assert error.retry_after_s == pytest.approx(30.0)
    clock.advance(29.9)
    await refused(h, "acme", "c2", 300)
    clock.advance(0.1)
    assert (await h.store.reserve("acme", "c2", 300, TTL)).tokens == 300
    await refused(h, "acme", "c3", 1)


async def test_refunds_never_lift_the_bucket_above_capacity(h: Harness) -> None:
    rate = 60_000_000  # refills 5 tokens in 5 us: full again by the release
    await make_tenant(h, tokens_per_minute=rate)
    reservation = await h.store.reserve("acme", "c1", 5, TTL)
    h.advance(0.001)
    assert await h.store.release("acme", "c1") is True
    usage = await h.store.usage("acme")
    assert usage.as_of - (reservation.expires_at - TTL) >= 5 / (rate / 60)
    assert usage.bucket_level == float(rate)


async def test_a_refund_at_a_full_bucket_is_no_burst_once_the_rate_rises(h: Harness) -> None:
    """A refund was stored on top of a full bucket (200 of a capacity of 100): every read capped
    it, until a higher rate read it and let the tenant take 200 at once."""
    clock = h.need_clock("refills over a minute")
    await make_tenant(h, tokens_per_minute=100)
    await h.store.reserve("acme", "c1", 100, ttl_s=120.0)
    clock.advance(60)  # full again by refill
    assert await h.store.release("acme", "c1") is True
    await h.store.update_tenant("acme", quota=TenantQuota(tokens_per_minute=1000))
    assert (await h.store.usage("acme")).bucket_level == 100.0
    assert (await refused(h, "acme", "c2", 101)).limit is QuotaLimit.TOKEN_RATE


async def test_daily_budget(h: Harness) -> None:
    await make_tenant(h, daily_token_budget=1000)
    await h.store.reserve("acme", "c1", 600, TTL)
    error = await refused(h, "acme", "c2", 500)
    usage = await h.store.usage("acme")
    assert error.limit is QuotaLimit.DAILY_BUDGET
    assert (error.allowed, error.requested) == (1000, 500)
    assert error.retry_after_s is not None
    to_midnight = DAY_S - usage.as_of % DAY_S
    assert to_midnight <= error.retry_after_s <= to_midnight + 5
    assert (await refused(h, "acme", "c3", 1001)).retry_after_s is None
    await h.store.settle("acme", "c1", 50, 50)
    assert (await h.store.reserve("acme", "c2", 500, TTL)).tokens == 500
    assert (await h.store.usage("acme")).tokens_today == 600


async def test_daily_budget_resets_at_utc_midnight(h: Harness) -> None:
    clock = h.need_clock("crosses a UTC midnight")
    await make_tenant(h, daily_token_budget=1000)
    await h.store.reserve("acme", "c1", 900, TTL)
    await h.store.settle("acme", "c1", 900, 0)
    await h.store.reserve("acme", "c2", 100, 10 * DAY_S)
    await refused(h, "acme", "c3", 1)
    clock.advance(DAY_S - clock.now % DAY_S)
    assert (await h.store.usage("acme")).tokens_today == 0
    await h.store.release("acme", "c2")  # charged yesterday: refunds nothing today
    assert (await h.store.reserve("acme", "c3", 1000, TTL)).tokens == 1000


async def test_expired_reservations_are_reclaimed(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=60, max_concurrent_calls=1, daily_token_budget=100)
    await h.store.reserve("acme", "lost", 40, h.tiny_ttl_s)
    h.advance(2 * h.tiny_ttl_s)
    usage = await h.store.usage("acme")
    assert (usage.active_reservations, usage.reserved_tokens, usage.tokens_today) == (0, 0, 0)
    assert usage.bucket_level == pytest.approx(60.0)
    assert await h.store.release("acme", "lost") is False
    with pytest.raises(CallClosed):
        await h.store.reserve("acme", "lost", 40, TTL)
    assert (await h.store.usage("acme")).settled_calls == 0


async def test_expiry_frees_a_concurrency_slot_at_the_next_reserve(h: Harness) -> None:
    await make_tenant(h, max_concurrent_calls=1)
    await h.store.reserve("acme", "crashed", 10, h.tiny_ttl_s)
    h.advance(2 * h.tiny_ttl_s)
    assert (await h.store.reserve("acme", "next", 10, TTL)).tokens == 10
    await refused(h, "acme", "third", 10)


async def test_quota_update_applies_to_the_next_call(h: Harness) -> None:
    await make_tenant(h, max_concurrent_calls=1)
    await h.store.reserve("acme", "c1", 10, TTL)
    await refused(h, "acme", "c2", 10)
    await h.store.update_tenant("acme", quota=TenantQuota(max_concurrent_calls=2))
    assert (await h.store.reserve("acme", "c2", 10, TTL)).tokens == 10


async def test_tenants_cannot_touch_each_others_calls_or_jobs(h: Harness) -> None:
    await make_tenant(h)
    await make_tenant(h, "beta")
    await h.store.reserve("acme", "c1", 10, TTL)
    await h.store.admit_job("acme", "j1", 1)
    assert await h.store.settle("beta", "c1", 5, 5) is False
    assert await h.store.release("beta", "c1") is False
    assert await h.store.finish_job("beta", "j1") is False
    await h.store.reserve("acme", "shared", 10, TTL)
    await h.store.reserve("beta", "shared", 20, TTL)
    assert await h.store.settle("beta", "shared", 15, 5) is True
    acme = await h.store.usage("acme")
    assert (acme.active_reservations, acme.reserved_tokens, acme.queued_jobs) == (2, 20, 1)
    assert acme.settled_calls == 0
    assert await h.store.settle("acme", "c1", 5, 5) is True
    assert await h.store.settle("acme", "shared", 1, 1) is True
    beta = await h.store.usage("beta")
    assert (beta.settled_calls, beta.input_tokens, beta.active_reservations) == (1, 15, 0)


async def test_invalid_arguments(h: Harness) -> None:
    await make_tenant(h)
    with pytest.raises(RequestInvalid):
        await h.store.reserve("acme", "c1", -1, TTL)
    with pytest.raises(RequestInvalid):
        await h.store.reserve("acme", "c1", 10, 0.0)
    with pytest.raises(RequestInvalid):
        await h.store.reserve("acme", "", 10, TTL)
    with pytest.raises(RequestInvalid):
        await h.store.settle("acme", "c1", 1, -1)
    with pytest.raises(RequestInvalid):
        await h.store.admit_job("acme", "j1", -1)
    assert (await h.store.usage("acme")).active_reservations == 0


# Jobs


async def test_job_admission(h: Harness) -> None:
    await make_tenant(h, max_queued_jobs=2, max_nodes_per_job=5)
    assert await h.store.admit_job("acme", "j1", 5) is True
    assert await h.store.admit_job("acme", "j1", 5) is False
    nodes = await _refused_job(h, "j2", 6)
    assert (nodes.limit, nodes.allowed, nodes.requested) == (QuotaLimit.NODES_PER_JOB, 5, 6)
    assert nodes.retry_after_s is None
    assert await h.store.admit_job("acme", "j2", 1) is True
    queued = await _refused_job(h, "j3", 1)
    assert (queued.limit, queued.allowed, queued.retry_after_s) == (
        QuotaLimit.QUEUED_JOBS,
        2,
        BUSY_RETRY_S,
    )
    assert (await h.store.usage("acme")).queued_jobs == 2
    assert await h.store.finish_job("acme", "j1") is True
    assert await h.store.finish_job("acme", "j1") is False
    assert await h.store.admit_job("acme", "j3", 1) is True


async def test_admit_and_reserve_in_one_step(h: Harness) -> None:
    await make_tenant(h, max_queued_jobs=2, tokens_per_minute=60)
    held = await h.store.admit_job_and_reserve("acme", "j1", 1, "j1/a", 40, TTL)
    assert held is not None and held.tokens == 40
    again = await h.store.admit_job_and_reserve("acme", "j1", 1, "j1/a", 40, TTL)
    assert again == held  # both halves are idempotent
    usage = await h.store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations, usage.tokens_today) == (1, 1, 40)
    assert await h.store.reserve("acme", "j1/a", 40, TTL) == held
    assert await h.store.settle("acme", "j1/a", 10, 5, finish_job="j1") is True
    assert (await h.store.usage("acme")).queued_jobs == 0


async def test_a_refused_admission_reserves_nothing(h: Harness) -> None:
    await make_tenant(h, max_queued_jobs=1, max_nodes_per_job=2)
    await h.store.admit_job("acme", "j1", 1)
    with pytest.raises(QuotaExceeded) as queued:
        await h.store.admit_job_and_reserve("acme", "j2", 1, "j2/a", 10, TTL)
    assert queued.value.limit is QuotaLimit.QUEUED_JOBS
    with pytest.raises(QuotaExceeded) as nodes:
        await h.store.admit_job_and_reserve("acme", "j3", 3, "j3/a", 10, TTL)
    assert nodes.value.limit is QuotaLimit.NODES_PER_JOB
    usage = await h.store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations, usage.tokens_today) == (1, 0, 0)
    with pytest.raises(TenantNotFound):
        await h.store.admit_job_and_reserve("ghost", "j1", 1, "j1/a", 10, TTL)
    with pytest.raises(RequestInvalid):
        await h.store.admit_job_and_reserve("acme", "j4", 1, "", 10, TTL)


async def test_a_refused_reservation_leaves_the_job_admitted(h: Harness) -> None:
    await make_tenant(h, tokens_per_minute=60, max_concurrent_calls=1)
    assert await h.store.admit_job_and_reserve("acme", "j1", 1, "j1/a", 61, TTL) is None
    await h.store.reserve("acme", "other", 1, TTL)
    assert await h.store.admit_job_and_reserve("acme", "j2", 1, "j2/a", 1, TTL) is None
    await h.store.release("acme", "late")
    assert await h.store.admit_job_and_reserve("acme", "j3", 1, "late", 1, TTL) is None
    usage = await h.store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations, usage.reserved_tokens) == (3, 1, 1)
    await h.store.release("acme", "other")
    assert (await h.store.reserve("acme", "j2/a", 1, TTL)).tokens == 1  # the usual way on


async def test_settling_a_jobs_last_call_finishes_the_job_in_the_same_step(h: Harness) -> None:
    await make_tenant(h, max_queued_jobs=1, tokens_per_minute=60)
    await h.store.admit_job("acme", "j1", 1)
    await h.store.reserve("acme", "j1/a", 30, TTL)
    assert await h.store.settle("acme", "j1/a", 10, 5, finish_job="j1") is True
    usage = await h.store.usage("acme")
    assert (usage.queued_jobs, usage.settled_calls, usage.active_reservations) == (0, 1, 0)
    assert (usage.input_tokens, usage.output_tokens, usage.tokens_today) == (10, 5, 15)
    assert await h.store.finish_job("acme", "j1") is False
    assert await h.store.settle("acme", "j1/a", 10, 5, finish_job="j1") is False
    assert (await h.store.usage("acme")).settled_calls == 1
    assert await h.store.admit_job("acme", "j2", 1) is True


async def test_a_settle_that_finds_no_open_call_still_finishes_the_job(h: Harness) -> None:
    await make_tenant(h, max_queued_jobs=2)
    await h.store.admit_job("acme", "j1", 1)
    await h.store.admit_job("acme", "j2", 1)
    await h.store.reserve("acme", "j1/a", 10, TTL)
    assert await h.store.release("acme", "j1/a") is True
    assert await h.store.settle("acme", "j1/a", 1, 1, finish_job="j1") is False
    usage = await h.store.usage("acme")
    assert (usage.queued_jobs, usage.settled_calls) == (1, 0)
    assert await h.store.finish_job("acme", "j1") is False
    assert await h.store.finish_job("acme", "j2") is True
    with pytest.raises(RequestInvalid):
        await h.store.settle("acme", "j1/b", 1, 1, finish_job="")


async def test_jobs_of_a_crashed_gateway_expire(h: Harness) -> None:
    await make_tenant(h, max_queued_jobs=1)
    await h.store.admit_job("acme", "j1", 1, ttl_s=h.tiny_ttl_s)
    h.advance(2 * h.tiny_ttl_s)
    assert (await h.store.usage("acme")).queued_jobs == 0
    assert await h.store.admit_job("acme", "j2", 1) is True


async def _refused_job(h: Harness, job_id: str, num_nodes: int) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as caught:
        await h.store.admit_job("acme", job_id, num_nodes)
    return caught.value


async def test_closed_store_fails_closed(h: Harness) -> None:
    await make_tenant(h)
    await h.store.aclose()
    with pytest.raises(QuotaUnavailable):
        await h.store.reserve("acme", "c1", 1, TTL)
    with pytest.raises(QuotaUnavailable):
        await h.store.usage("acme")


@pytest.mark.redis
async def test_redis_keeps_only_the_key_hash(redis_prefix: str) -> None:
    async with RedisQuotaStore(REDIS_URL, prefix=redis_prefix) as store:
        await store.create_tenant("acme", "Acme", TenantQuota())
        key_id, plaintext = await store.issue_key("acme")
    secret = plaintext.split("_", 2)[2]
    with SyncRedis.from_url(REDIS_URL, decode_responses=True) as client:
        stored: list[str] = []
        for name in client.scan_iter(match=f"{redis_prefix}:*"):
            match client.type(name):
                case "hash":
                    stored += [item for pair in client.hgetall(name).items() for item in pair]
                case "set":
                    stored += client.smembers(name)
                case other:
                    stored.append(other)
        record = client.hgetall(f"{redis_prefix}:key:{key_id}")
    assert record["key_hash"] == hash_key(plaintext)
    assert not any(secret in value for value in stored)


def stored_keys(prefix: str) -> dict[str, dict[str, str]]:
    """Every key under `prefix` on the local Redis: hashes with their fields, others empty."""
    with SyncRedis.from_url(REDIS_URL, decode_responses=True) as client:
        return {
            name: client.hgetall(name) if client.type(name) == "hash" else {}
            for name in client.scan_iter(match=f"{prefix}:*")
        }


@pytest.mark.redis
async def test_redis_issue_key_for_a_missing_tenant_writes_nothing(redis_prefix: str) -> None:
    async with RedisQuotaStore(REDIS_URL, prefix=redis_prefix) as store:
        with pytest.raises(TenantNotFound):
            await store.issue_key("ghost")
    assert stored_keys(redis_prefix) == {}


@pytest.mark.redis
async def test_redis_revokes_a_key_in_one_step(redis_prefix: str) -> None:
    """Three round trips once (read the record, delete it, take it off the key set): a failure
    after the delete left a revocation that its retry, finding no key, never finished."""
    async with RedisQuotaStore(REDIS_URL, prefix=redis_prefix) as store:
        await store.create_tenant("acme", "Acme", TenantQuota())
        key_id, _ = await store.issue_key("acme")
        assert await store.revoke_key("acme", "0123456789abcdef") is False  # the script loaded
        before = round_trips()
        assert await store.revoke_key("acme", key_id) is True
        assert round_trips() == before + 1
    left = {f"{redis_prefix}:{{acme}}:tenant", f"{redis_prefix}:tenants"}  # no record, no set
    kept = {key for key in stored_keys(redis_prefix) if ":reply:" not in key}  # the creation's
    assert kept == left


@pytest.mark.redis
async def test_redis_revoke_finishes_a_revocation_left_half_done(redis_prefix: str) -> None:
    """The record deleted, the key set still naming it (what a failure part-way through the
    earlier three round trips left): the retry answers False and takes the name off."""
    async with RedisQuotaStore(REDIS_URL, prefix=redis_prefix) as store:
        await store.create_tenant("acme", "Acme", TenantQuota())
        key_id, _ = await store.issue_key("acme")
        with SyncRedis.from_url(REDIS_URL) as client:
            client.delete(f"{redis_prefix}:key:{key_id}")
        assert await store.revoke_key("acme", key_id) is False
    assert f"{redis_prefix}:{{acme}}:keys" not in stored_keys(redis_prefix)


@pytest.mark.redis
async def test_redis_delete_tenant_leaves_no_key_record(redis_prefix: str) -> None:
    async with RedisQuotaStore(REDIS_URL, prefix=redis_prefix) as store:
        for tenant_id in ("acme", "beta"):
            await store.create_tenant(tenant_id, tenant_id.title(), TenantQuota())
        acme_keys = [(await store.issue_key("acme"))[1] for _ in range(3)]
        _, beta_key = await store.issue_key("beta")
        await store.reserve("acme", "c1", 10, TTL)
        await store.delete_tenant("acme")
        for plaintext in acme_keys:
            with pytest.raises(AuthFailed):
                await store.authenticate(plaintext)
        assert await store.authenticate(beta_key) == "beta"
    left = stored_keys(redis_prefix)
    records = {name: r for name, r in left.items() if name.startswith(f"{redis_prefix}:key:")}
    assert [record["tenant_id"] for record in records.values()] == ["beta"]
    assert not [name for name in left if name.startswith(f"{redis_prefix}:{{acme}}:")]
    with SyncRedis.from_url(REDIS_URL, decode_responses=True) as client:
        assert client.smembers(f"{redis_prefix}:tenants") == {"beta"}
