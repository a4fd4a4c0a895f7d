"""Who asks and how much they may take: tenants, API keys and quotas (docs/ARCHITECTURE.md §5).

`QuotaStore` is the contract every store keeps: `RedisQuotaStore` (shared by gateway processes,
one Lua script per operation) and `MemoryQuotaStore` (one process). The records are `Tenant`,
`TenantQuota`, `ApiKey`, `Reservation` and `Usage`; API keys are made and checked by the functions
of `api_keys.py` (`bearer_token`, `hash_key`, `key_prefix`, `new_admin_key`, `verify_admin`); the
errors are named for the state they report. Whose call runs next is the `policies` subpackage's.
Imports none of fairgate's other packages.
"""

from tenants.api_keys import bearer_token, hash_key, key_prefix, new_admin_key, verify_admin
from tenants.errors import (
    AuthFailed,
    CallClosed,
    KeyOfAnotherTenant,
    KeysFull,
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
from tenants.memory_store import MemoryQuotaStore
from tenants.models import ApiKey, Reservation, Tenant, TenantQuota, Usage
from tenants.redis_store import RedisQuotaStore
from tenants.store import QuotaStore

__all__ = [
    "ApiKey",
    "AuthFailed",
    "CallClosed",
    "KeyOfAnotherTenant",
    "KeysFull",
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
    "key_prefix",
    "new_admin_key",
    "verify_admin",
]
