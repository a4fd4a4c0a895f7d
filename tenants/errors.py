"""Tenant, key and quota errors, named for the state they report.

`QuotaExceeded` carries what the gRPC edge needs for RESOURCE_EXHAUSTED with QuotaFailure
(`subject`, `description`), ErrorInfo (`reason`, `metadata`) and RetryInfo (`retry_after_s`).
"""

from __future__ import annotations

import enum


class TenantsError(Exception):
    """Base class of tenant and quota errors."""


class TenantNotFound(TenantsError, KeyError):
    """No tenant has this id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "tenant not found"


class TenantExists(TenantsError):
    """A tenant with this id already exists."""


class TenantInvalid(TenantsError, ValueError):
    """A tenant id or display name that breaks the naming rules."""


class QuotaInvalid(TenantsError, ValueError):
    """Quota settings that cannot be enforced (negative limits, default above the ceiling...)."""


class RequestInvalid(TenantsError, ValueError):
    """An argument no store call accepts (negative tokens, a non-positive TTL, an empty id)."""


class KeyOfAnotherTenant(TenantsError):
    """The key id names a live key of another tenant than the one named with it."""


class KeysFull(TenantsError):
    """The tenant holds as many live keys as a tenant may (`MAX_KEYS_PER_TENANT`)."""

    def __init__(self, tenant_id: str, limit: int) -> None:
        super().__init__(
            f"tenant {tenant_id!r} holds {limit} live API keys, the most a tenant may: revoke one"
            " first"
        )


class AuthFailed(TenantsError):
    """The presented API key is malformed, unknown, revoked or wrong."""


class CallClosed(TenantsError):
    """This call id was already settled, released or reclaimed; it cannot be reserved again."""


class QuotaUnavailable(TenantsError):
    """The quota store cannot be reached or did not answer in time; budgets fail closed."""


class QuotaLimit(enum.StrEnum):
    """Which limit refused; the value is the ErrorInfo reason code, one `QUOTA_*` set for all."""

    TOKEN_RATE = "QUOTA_TOKEN_RATE"
    CONCURRENT_CALLS = "QUOTA_CONCURRENT_CALLS"
    DAILY_BUDGET = "QUOTA_DAILY_BUDGET"
    QUEUED_JOBS = "QUOTA_QUEUED_JOBS"
    QUEUED_CHARS = "QUOTA_QUEUED_CHARS"
    NODES_PER_JOB = "QUOTA_NODES_PER_JOB"
    STREAMS = "QUOTA_STREAMS"
    ADMISSIONS = "QUOTA_ADMISSIONS"
    RPCS = "QUOTA_RPCS"


class QuotaExceeded(TenantsError):
    """A tenant limit refused a call or a job.

    `retry_after_s` is None when waiting cannot help (the request is larger than the limit).
    """

    def __init__(
        self,
        *,
        tenant_id: str,
        limit: QuotaLimit,
        allowed: int,
        requested: int,
        description: str,
        retry_after_s: float | None,
    ) -> None:
        super().__init__(description)
        self.tenant_id = tenant_id
        self.limit = limit
        self.allowed = allowed
        self.requested = requested
        self.description = description
        self.retry_after_s = retry_after_s

    @property
    def subject(self) -> str:
        return f"tenant:{self.tenant_id}"

    @property
    def reason(self) -> str:
        return self.limit.value

    @property
    def metadata(self) -> dict[str, str]:
        return {
            "tenant_id": self.tenant_id,
            "allowed": str(self.allowed),
            "requested": str(self.requested),
        }
