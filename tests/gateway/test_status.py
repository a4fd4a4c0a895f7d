"""The status snapshot from fixed inputs, and Admin.GetStatus through a real gateway."""

from __future__ import annotations

import pytest

from fairgate import AdminClient, InvalidArgument, PermissionDenied, Unauthenticated
from gateway.recent import Latencies, TenantWindow
from gateway.status import (
    DEFAULT_TENANTS,
    MAX_TENANTS,
    BackendStatus,
    Observed,
    TenantLoad,
    build_status,
    clamp_limit,
)
from tests.gateway.busy import two_tenants_running
from tests.gateway.conftest import ADMIN_KEY, Harness
from tests.reliability.harness import reliable_gateway

LOCAL = BackendStatus("local", "default", 3, 1, 0.25, True)


LATENCIES = {"beta": Latencies(0.1, 0.2, 0.01, 0.02)}


def latencies(tenant_id: str) -> Latencies:
    return LATENCIES.get(tenant_id, Latencies())


def observed() -> Observed:
    alpha = TenantLoad(1, 1, ready_calls=1, running_calls=2, running_kv_token_steps=30.0)
    beta = TenantLoad(running_jobs=1, running_calls=1, running_kv_token_steps=10.0)
    loads = {"alpha": alpha, "beta": beta}
    return Observed(loads, {"alpha": 2.0, "beta": 1.0}, (LOCAL,))


def test_shares_are_over_every_active_tenant_and_the_most_active_come_first() -> None:
    recent = {"beta": TenantWindow(40.0, 4), "gamma": TenantWindow(20.0, 1)}
    status = build_status(observed(), recent, latencies, now=100.0, window_s=60.0)
    assert [t.tenant_id for t in status.tenants] == ["alpha", "beta", "gamma"]
    alpha, beta, gamma = status.tenants
    assert (alpha.queued_jobs, alpha.running_jobs) == (1, 1)
    assert (alpha.ready_calls, alpha.running_calls) == (1, 2)
    assert [t.served_kv_token_steps for t in status.tenants] == [30.0, 50.0, 20.0]
    assert [t.served_share for t in status.tenants] == [0.3, 0.5, 0.2]
    assert [t.weight for t in status.tenants] == [2.0, 1.0, 1.0]  # gamma: the default weight
    assert [t.fair_share for t in status.tenants] == [0.5, 0.25, 0.25]
    assert (alpha.window_calls, alpha.ttft_p50_s) == (0, None)  # no call ended in the window
    assert (beta.window_calls, beta.ttft_p50_s, beta.ttft_p99_s) == (4, 0.1, 0.2)
    assert (beta.queue_wait_p50_s, beta.queue_wait_p99_s) == (0.01, 0.02)
    assert gamma.running_calls == 0
    assert (status.time, status.window_s, status.active_tenants) == (100.0, 60.0, 3)
    assert status.backends == (LOCAL,)
    assert (status.overload_level, status.overload_reason) == (0, "")


def test_the_listing_is_cut_after_the_shares_are_computed() -> None:
    asked: list[str] = []

    def latencies_of(tenant_id: str) -> Latencies:
        asked.append(tenant_id)
        return Latencies()

    status = build_status(observed(), {"gamma": TenantWindow(60.0, 1)}, latencies_of, 0, 60, 1)
    assert asked == ["alpha"]  # only the listed tenants' latencies are computed
    assert [t.tenant_id for t in status.tenants] == ["alpha"]
    assert status.active_tenants == 3
    assert status.tenants[0].served_share == 0.3
    assert (clamp_limit(0), clamp_limit(-3), clamp_limit(5)) == (DEFAULT_TENANTS, 20, 5)
    assert clamp_limit(10_000) == MAX_TENANTS


def test_a_quiet_gateway_has_no_tenants_and_no_division_by_zero() -> None:
    empty = build_status(Observed({}, {}, ()), {}, latencies, 0.0, 60.0, 20, 2, "ttft")
    assert (empty.tenants, empty.active_tenants, empty.overload_level) == ((), 0, 2)
    quiet = Observed({"a": TenantLoad(queued_jobs=1)}, {"a": 1.0}, ())
    idle = build_status(quiet, {}, latencies, 0.0, 60.0)
    assert (idle.tenants[0].served_share, idle.tenants[0].fair_share) == (0.0, 1.0)


# --- through a real gateway -----------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.engine_step_s(0.01)
async def test_get_status_shows_each_tenant_and_backend_now(harness: Harness) -> None:
    await two_tenants_running(harness)
    async with AdminClient(harness.target, ADMIN_KEY) as admin:
        status = await admin.get_status()
        assert status.active_tenants == 2 and status.time is not None
        tenants = {t.tenant_id: t for t in status.tenants}
        alpha, beta = tenants["alpha"], tenants["beta"]
        for tenant in (alpha, beta):
            assert (tenant.queued_jobs, tenant.running_jobs) == (0, 1)
            assert (tenant.ready_calls, tenant.running_calls) == (0, 2)
            assert tenant.served_kv_token_steps > 0
        assert (alpha.weight, beta.weight) == (2.0, 1.0)
        assert (alpha.fair_share, beta.fair_share) == pytest.approx((2 / 3, 1 / 3))
        assert alpha.served_share + beta.served_share == pytest.approx(1.0)
        assert alpha.window_calls == 1 and alpha.ttft_p50_s is not None
        assert alpha.queue_wait_p99_s is not None and beta.ttft_p50_s is None
        assert status.window_s == 60.0
        (local,) = status.backends
        assert (local.name, local.healthy, local.running + local.waiting) == ("local", True, 4)
        assert local.kv_usage is not None and 0 < local.kv_usage < 1
        assert (status.overload_level, status.overload_reason) == (0, "")
        one = await admin.get_status(max_tenants=1)
        assert len(one.tenants) == 1 and one.active_tenants == 2
        with pytest.raises(InvalidArgument, match="max_tenants"):
            await admin.get_status(max_tenants=-1)


@pytest.mark.anyio
async def test_get_status_needs_the_admin_key(harness: Harness) -> None:
    async with AdminClient(harness.target, harness.keys["alpha"]) as tenant:
        with pytest.raises(PermissionDenied):
            await tenant.get_status()
    async with AdminClient(harness.target, "fg_not_a_key") as stranger:
        with pytest.raises(Unauthenticated):
            await stranger.get_status()
    async with AdminClient(harness.target, ADMIN_KEY) as admin:
        quiet = await admin.get_status()
    assert (quiet.tenants, quiet.active_tenants) == ((), 0)
    assert [b.name for b in quiet.backends] == ["local"]


@pytest.mark.anyio
async def test_get_status_answers_with_overload_control_on() -> None:
    """It failed INTERNAL (a name imported for type checking only) whenever SLO targets were
    set: the operator's view went dark with the feature meant for load."""
    async with (
        reliable_gateway(slo_targets=[{"tenant": "*", "ttft_s": 1.0}]) as h,
        AdminClient(f"127.0.0.1:{h.gateway.port}", ADMIN_KEY) as admin,
    ):
        status = await admin.get_status()
    assert status.overload_reason == "normal"
