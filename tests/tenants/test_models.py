"""Quota settings validate on construction and round-trip through their flat field form."""

from __future__ import annotations

import math

import pytest

from tenants import QuotaInvalid, TenantInvalid, TenantQuota
from tenants.models import check_tenant_id


@pytest.mark.parametrize(
    "fields",
    [
        {"weight": 0.0},
        {"weight": -1.0},
        {"weight": math.inf},
        {"weight": math.nan},
        {"weight": 1e-300},  # its charges overflowed the pool's shared counters
        {"weight": 1e-4},
        {"weight": 1e4},
        {"tokens_per_minute": -1},
        {"tokens_per_minute": 2**53 + 1},  # past what Redis' Lua counts exactly
        {"max_streams": 2**31},  # past its int32 in the admin API: no view could show it
        {"max_concurrent_calls": 1.5},
        {"daily_token_budget": True},
        {"max_tokens_ceiling": 0},
        {"default_max_tokens": 0},
        {"max_tokens_ceiling": 100, "default_max_tokens": 101},
    ],
)
def test_unenforceable_quotas_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(QuotaInvalid):
        TenantQuota(**fields)  # type: ignore[arg-type]


def test_fields_round_trip() -> None:
    quota = TenantQuota(
        weight=0.25,
        tokens_per_minute=6000,
        max_concurrent_calls=3,
        max_queued_jobs=4,
        max_nodes_per_job=50,
        max_prompt_tokens=2048,
        max_tokens_ceiling=1024,
        default_max_tokens=128,
        daily_token_budget=10**9,
        max_streams=16,
    )
    assert TenantQuota.from_fields(quota.as_fields()) == quota
    assert TenantQuota.from_fields({}) == TenantQuota()


def test_defaults_bound_every_count() -> None:
    """A tenant created without a quota cannot take the whole gateway."""
    quota = TenantQuota()
    assert (quota.max_concurrent_calls, quota.max_queued_jobs, quota.max_streams) == (64, 256, 64)
    assert (quota.max_nodes_per_job, quota.max_prompt_tokens) == (256, 8192)
    assert (quota.max_tokens_ceiling, quota.default_max_tokens) == (512, 256)
    assert (quota.tokens_per_minute, quota.daily_token_budget) == (0, 0)


@pytest.mark.parametrize("tenant_id", ["", "-lead", "a" * 65, "x" * 1_000_000, None, 42])
def test_a_bad_tenant_id_is_refused_quoting_its_start_alone(tenant_id: object) -> None:
    with pytest.raises(TenantInvalid) as refused:
        check_tenant_id(tenant_id)  # type: ignore[arg-type]
    assert len(str(refused.value)) < 200
