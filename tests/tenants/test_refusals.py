"""Refusals carry one set of ErrorInfo reasons, `QUOTA_*`, and the retry hint of their limit."""

from __future__ import annotations

from tenants import QuotaLimit, refusals
from tenants.models import BUSY_RETRY_S


def test_reasons_are_one_set() -> None:
    assert {limit.value for limit in QuotaLimit} == {
        "QUOTA_TOKEN_RATE",
        "QUOTA_CONCURRENT_CALLS",
        "QUOTA_DAILY_BUDGET",
        "QUOTA_QUEUED_JOBS",
        "QUOTA_QUEUED_CHARS",
        "QUOTA_NODES_PER_JOB",
        "QUOTA_STREAMS",
        "QUOTA_ADMISSIONS",
        "QUOTA_RPCS",
    }


def test_streams_refusal() -> None:
    error = refusals.streams("acme", 64, 64)
    assert (error.reason, error.subject) == ("QUOTA_STREAMS", "tenant:acme")
    assert (error.allowed, error.requested, error.retry_after_s) == (64, 65, BUSY_RETRY_S)
    assert error.metadata == {"tenant_id": "acme", "allowed": "64", "requested": "65"}
    assert "64 open streams" in error.description
