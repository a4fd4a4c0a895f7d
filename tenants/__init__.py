"""Who asks and how much they may take: tenants, API keys and quotas (docs/ARCHITECTURE.md §5)."""

from tenants.errors import (
    AuthFailed,
    CallClosed,
    QuotaExceeded,
    QuotaInvalid,
    QuotaLimit,
    QuotaUnavailable,
    RequestInvalid,
    TenantExists,
    TenantInvalid,
    TenantNotFound,
    TenantsError,
)
from tenants.keys import bearer_token, hash_key, new_admin_key, verify_admin
from tenants.memory_store import MemoryQuotaStore
from tenants.models import ApiKey, Reservation, Tenant, TenantQuota, Usage
from tenants.redis_store import RedisQuotaStore
from tenants.store import QuotaStore

__all__ = [
    "ApiKey",
    "AuthFailed",
    "CallClosed",
    "MemoryQuotaStore",
    "QuotaExceeded",
    "QuotaInvalid",
    "QuotaLimit",
    "QuotaStore",
    "QuotaUnavailable",
    "RedisQuotaStore",
    "RequestInvalid",
    "Reservation",
    "Tenant",
    "TenantExists",
    "TenantInvalid",
    "TenantNotFound",
    "TenantQuota",
    "TenantsError",
    "Usage",
    "bearer_token",
    "hash_key",
    "new_admin_key",
    "verify_admin",
]
