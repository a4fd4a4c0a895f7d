"""The in-memory twin of the Redis quota store: same contract, one process, injected clock.

Each operation yields once (a cancellation point, like a network call) and then runs to the end
without awaiting, so concurrent coroutines never interleave inside one: that is what the Lua
scripts' atomicity gives the Redis store. Quota arithmetic lives in `TenantLedger`; this class
keeps the registry and the key table around it.
Invariant: every key record names a live tenant; every tenant has exactly one ledger.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio.lowlevel

from tenants import api_keys
from tenants.errors import (
    AuthFailed,
    CallClosed,
    KeyOfAnotherTenant,
    KeysFull,
    QuotaExceeded,
    QuotaUnavailable,
    TenantExists,
    TenantNotFound,
)
from tenants.ledger import TenantLedger
from tenants.models import (
    MAX_KEYS_PER_TENANT,
    ApiKey,
    Reservation,
    Tenant,
    TenantQuota,
    Usage,
    check_count,
    check_display_name,
    check_id,
    check_ids,
    check_tenant_id,
    check_ttl,
)
from tenants.store import ClosesOnExit, ids_after


@dataclass(slots=True)
class _KeyRecord:
    info: ApiKey
    key_hash: str


class MemoryQuotaStore(ClosesOnExit):
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._tenants: dict[str, Tenant] = {}
        self._ledgers: dict[str, TenantLedger] = {}
        self._keys: dict[str, _KeyRecord] = {}
        self._key_ids: dict[str, set[str]] = {}  # per tenant: a listing reads its keys alone
        self._closed = False

    async def aclose(self) -> None:
        self._closed = True

    async def create_tenant(self, tenant_id: str, display_name: str, quota: TenantQuota) -> Tenant:
        await self._enter()
        check_tenant_id(tenant_id)
        check_display_name(display_name)
        if tenant_id in self._tenants:
            raise TenantExists(f"tenant {tenant_id!r} already exists")
        tenant = Tenant(tenant_id, display_name, quota, self._clock())
        self._tenants[tenant_id] = tenant
        self._ledgers[tenant_id] = TenantLedger(tenant_id)
        self._key_ids[tenant_id] = set()
        return tenant

    async def get_tenant(self, tenant_id: str) -> Tenant:
        await self._enter()
        return self._tenant(tenant_id)

    async def list_tenants(self, after: str = "", limit: int = 0) -> list[Tenant]:
        await self._enter()
        page = ids_after(self._tenants, after)[: limit or None]
        return [self._tenants[tenant_id] for tenant_id in page]

    async def update_tenant(
        self,
        tenant_id: str,
        *,
        display_name: str | None = None,
        quota: TenantQuota | None = None,
    ) -> Tenant:
        await self._enter()
        tenant = self._tenant(tenant_id)
        tenant = Tenant(
            tenant_id,
            tenant.display_name if display_name is None else check_display_name(display_name),
            tenant.quota if quota is None else quota,
            tenant.created_at,
        )
        self._tenants[tenant_id] = tenant
        return tenant

    async def delete_tenant(self, tenant_id: str) -> None:
        await self._enter()
        self._tenant(tenant_id)
        for key_id in self._key_ids.pop(tenant_id):
            del self._keys[key_id]
        del self._tenants[tenant_id]
        del self._ledgers[tenant_id]

    async def issue_key(self, tenant_id: str) -> tuple[str, str]:
        await self._enter()
        self._tenant(tenant_id)
        if len(self._key_ids[tenant_id]) >= MAX_KEYS_PER_TENANT:
            raise KeysFull(tenant_id, MAX_KEYS_PER_TENANT)
        key_id, plaintext = api_keys.new_key()
        info = ApiKey(key_id, tenant_id, self._clock())
        self._keys[key_id] = _KeyRecord(info, api_keys.hash_key(plaintext))
        self._key_ids[tenant_id].add(key_id)
        return key_id, plaintext

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        await self._enter()
        self._tenant(tenant_id)
        found = [self._keys[key_id].info for key_id in self._key_ids[tenant_id]]
        return sorted(found, key=lambda info: (info.created_at, info.key_id))

    async def revoke_key(self, tenant_id: str, key_id: str) -> bool:
        await self._enter()
        record = self._keys.get(api_keys.check_key_id(key_id))
        if record is None:
            return False
        if record.info.tenant_id != tenant_id:
            raise KeyOfAnotherTenant(f"key {key_id!r} is not tenant {tenant_id!r}'s")
        del self._keys[key_id]
        self._key_ids[tenant_id].discard(key_id)
        return True

    async def authenticate(self, plaintext: str) -> str:
        await self._enter()
        record = self._keys.get(api_keys.key_id_of(plaintext))
        if record is None or not api_keys.key_matches(plaintext, record.key_hash):
            raise AuthFailed("unknown or revoked API key")
        return record.info.tenant_id

    async def admit_job(
        self, tenant_id: str, job_id: str, num_nodes: int, *, ttl_s: float = 3600.0
    ) -> bool:
        await self._enter()
        check_id("job_id", job_id)
        check_count("num_nodes", num_nodes)
        check_ttl(ttl_s)
        quota = self._tenant(tenant_id).quota
        return self._ledgers[tenant_id].admit_job(quota, job_id, num_nodes, ttl_s, self._clock())

    async def admit_job_and_reserve(
        self,
        tenant_id: str,
        job_id: str,
        num_nodes: int,
        call_id: str,
        tokens: int,
        call_ttl_s: float,
        *,
        ttl_s: float = 3600.0,
    ) -> Reservation | None:
        await self._enter()
        check_id("job_id", job_id)
        check_count("num_nodes", num_nodes)
        check_ttl(ttl_s)
        check_id("call_id", call_id)
        check_count("tokens", tokens)
        check_ttl(call_ttl_s)
        quota, ledger, now = self._tenant(tenant_id).quota, self._ledgers[tenant_id], self._clock()
        ledger.admit_job(quota, job_id, num_nodes, ttl_s, now)
        try:
            return ledger.reserve(quota, call_id, tokens, call_ttl_s, now)
        except (QuotaExceeded, CallClosed):
            return None

    async def finish_job(self, tenant_id: str, job_id: str) -> bool:
        await self._enter()
        ledger = self._ledgers.get(tenant_id)
        return ledger is not None and ledger.finish_job(job_id)

    async def reserve(self, tenant_id: str, call_id: str, tokens: int, ttl_s: float) -> Reservation:
        await self._enter()
        check_id("call_id", call_id)
        check_count("tokens", tokens)
        check_ttl(ttl_s)
        quota = self._tenant(tenant_id).quota
        return self._ledgers[tenant_id].reserve(quota, call_id, tokens, ttl_s, self._clock())

    async def settle(
        self,
        tenant_id: str,
        call_id: str,
        input_tokens: int,
        output_tokens: int,
        *,
        finish_job: str | None = None,
    ) -> bool:
        await self._enter()
        check_id("call_id", call_id)
        check_count("input_tokens", input_tokens)
        check_count("output_tokens", output_tokens)
        if finish_job is not None:
            check_id("job_id", finish_job)
        if tenant_id not in self._tenants:
            return False
        ledger, quota = self._ledgers[tenant_id], self._tenants[tenant_id].quota
        if finish_job is not None:
            ledger.finish_job(finish_job)
        return ledger.settle(quota, call_id, input_tokens, output_tokens, self._clock())

    async def release(self, tenant_id: str, call_id: str) -> bool:
        await self._enter()
        check_id("call_id", call_id)
        if tenant_id not in self._tenants:
            return False
        quota = self._tenants[tenant_id].quota
        return self._ledgers[tenant_id].release(quota, call_id, self._clock())

    async def renew(
        self,
        tenant_id: str,
        *,
        calls: Sequence[str] = (),
        jobs: Sequence[str] = (),
        ttl_s: float,
    ) -> list[str]:
        await self._enter()
        call_ids, job_ids = check_ids("calls", calls), check_ids("jobs", jobs)
        ttl = check_ttl(ttl_s)
        if tenant_id not in self._tenants:
            return call_ids
        quota = self._tenants[tenant_id].quota
        return self._ledgers[tenant_id].renew(quota, call_ids, job_ids, ttl, self._clock())

    async def usage(self, tenant_id: str) -> Usage:
        await self._enter()
        quota = self._tenant(tenant_id).quota
        return self._ledgers[tenant_id].usage(quota, self._clock())

    async def _enter(self) -> None:
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise QuotaUnavailable("the quota store is closed")

    def _tenant(self, tenant_id: str) -> Tenant:
        tenant = self._tenants.get(tenant_id)
        if tenant is None:
            raise TenantNotFound(f"no tenant {tenant_id!r}")
        return tenant
