"""The quota store in Redis, shared by every gateway process.

Each quota operation is one Lua script from tenants/lua/ (registered once, run by EVALSHA and
reloaded on NOSCRIPT), so it is atomic and timed by Redis TIME: gateways on different machines
share one clock and one bucket. A tenant's keys carry the tenant as a hash tag
(`<prefix>:{<tenant>}:...`) and the quota scripts touch only keys passed in KEYS, so one tenant's
quota state lives in one cluster slot. The registry (`<prefix>:tenants`) and the key records
(`<prefix>:key:<id>`, looked up by key id at authentication) live outside that slot;
create_tenant.lua, delete_tenant.lua, issue_key.lua and revoke_key.lua change them in the same
atomic step as the tenant's own keys, and delete_tenant.lua derives the names of the tenant's
key records from its key set. Those scripts need a single Redis instance (or a deployment that
keeps every key of the store in one slot), not a sharded cluster. Every Redis error, unreachable
server or timeout leaves as QuotaUnavailable with a generic message (the detail goes to the log,
never to callers): budgets fail closed. Scripts are idempotent by call id and job id, which
makes one retry on a dropped connection safe; creating and deleting a tenant, which are not
(the retry of one that ran would find the tenant there, or gone), keep their reply a minute
under a nonce of their own, and the retry is answered with it.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from importlib import resources
from typing import Any

from tenants import api_keys
from tenants.errors import (
    AuthFailed,
    KeyOfAnotherTenant,
    KeysFull,
    QuotaUnavailable,
    TenantExists,
    TenantNotFound,
)
from tenants.models import (
    CLOSED_CALL_MEMORY_S,
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
from tenants.redis_client import RedisClient, fails_closed
from tenants.redis_replies import (
    decoded,
    held_after_admission,
    reservation_from,
    tenant_from,
    usage_from,
    verdict_of_admission,
)
from tenants.store import ClosesOnExit, ids_after

_SCRIPTS = (
    "reserve",
    "settle",
    "release",
    "renew",
    "usage",
    "admit_job",
    "admit_and_reserve",
    "create_tenant",
    "update_tenant",
    "delete_tenant",
    "issue_key",
    "revoke_key",
)
# KEYS[1..9] of the quota scripts, in the order tenants/lua/_lib.lua names them
_TENANT_KEYS = ("tenant", "bucket", "day", "open", "expiry", "closed", "usage", "jobs", "reclaimed")


def _script_source(name: str) -> str:
    lua = resources.files("tenants") / "lua"
    return (lua / "_lib.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


# The one place where Redis failures become QuotaUnavailable
_fails_closed = fails_closed(QuotaUnavailable, "quota store")


class RedisQuotaStore(RedisClient, ClosesOnExit):
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "fg",
        socket_timeout_s: float = 1.0,
        pool_size: int = 64,
        pool_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(url, pool_size, socket_timeout_s, pool_timeout_s)
        self._prefix = prefix
        self._scripts = {
            name: self._redis.register_script(_script_source(name)) for name in _SCRIPTS
        }
        self._tenant_keys = functools.lru_cache(maxsize=4096)(self._keys_of)

    @_fails_closed
    async def create_tenant(self, tenant_id: str, display_name: str, quota: TenantQuota) -> Tenant:
        check_tenant_id(tenant_id)
        check_display_name(display_name)
        fields = [item for pair in quota.as_fields().items() for item in pair]
        created_at = await self._scripts["create_tenant"](
            keys=[self._tenant_key(tenant_id), self._registry, self._reply_key()],
            args=[tenant_id, display_name, *fields],
        )
        if created_at is None:
            raise TenantExists(f"tenant {tenant_id!r} already exists")
        return Tenant(tenant_id, display_name, quota, float(created_at))

    @_fails_closed
    async def get_tenant(self, tenant_id: str) -> Tenant:
        record = await self._redis.hgetall(self._tenant_key(tenant_id))
        tenant = tenant_from(tenant_id, record)
        if tenant is None:
            raise TenantNotFound(f"no tenant {tenant_id!r}")
        return tenant

    @_fails_closed
    async def list_tenants(self, after: str = "", limit: int = 0) -> list[Tenant]:
        left = ids_after(map(decoded, await self._redis.smembers(self._registry)), after)
        found: list[Tenant] = []
        # a page's records are read until it is full: one deleted since the ids were read is
        # left out, and the page must not look like the last one for it
        while left and not 0 < limit <= len(found):
            ids, left = left[: limit or None], left[limit or len(left) :]
            async with self._redis.pipeline(transaction=False) as pipe:
                for tenant_id in ids:
                    pipe.hgetall(self._tenant_key(tenant_id))
                records = await pipe.execute()
            found += filter(None, map(tenant_from, ids, records))
        return found[: limit or None]

    @_fails_closed
    async def update_tenant(
        self,
        tenant_id: str,
        *,
        display_name: str | None = None,
        quota: TenantQuota | None = None,
    ) -> Tenant:
        fields = {} if quota is None else quota.as_fields()
        if display_name is not None:
            fields["display_name"] = check_display_name(display_name)
        args = [item for pair in fields.items() for item in pair]
        if not await self._scripts["update_tenant"](
            keys=self._tenant_keys(tenant_id)[:1], args=args
        ):
            raise TenantNotFound(f"no tenant {tenant_id!r}")
        return await self.get_tenant(tenant_id)

    @_fails_closed
    async def delete_tenant(self, tenant_id: str) -> None:
        deleted = await self._scripts["delete_tenant"](
            keys=[
                *self._tenant_keys(tenant_id),
                self._key_set(tenant_id),
                self._registry,
                self._reply_key(),
            ],
            args=[tenant_id, self._key_record("")],  # the prefix of every key record
        )
        if not deleted:
            raise TenantNotFound(f"no tenant {tenant_id!r}")

    @_fails_closed
    async def issue_key(self, tenant_id: str) -> tuple[str, str]:
        key_id, plaintext = api_keys.new_key()
        stored = await self._scripts["issue_key"](
            keys=[self._tenant_key(tenant_id), self._key_set(tenant_id), self._key_record(key_id)],
            args=[tenant_id, key_id, api_keys.hash_key(plaintext), MAX_KEYS_PER_TENANT],
        )
        if stored == -1:
            raise KeysFull(tenant_id, MAX_KEYS_PER_TENANT)
        if not stored:
            raise TenantNotFound(f"no tenant {tenant_id!r}")
        return key_id, plaintext

    @_fails_closed
    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        await self.get_tenant(tenant_id)
        key_ids = sorted(map(decoded, await self._redis.smembers(self._key_set(tenant_id))))
        async with self._redis.pipeline(transaction=False) as pipe:
            for key_id in key_ids:
                pipe.hget(self._key_record(key_id), "created_at")
            created = await pipe.execute()
        found = [
            ApiKey(key_id, tenant_id, float(at))
            for key_id, at in zip(key_ids, created, strict=True)
            if at is not None
        ]
        return sorted(found, key=lambda info: (info.created_at, info.key_id))

    @_fails_closed
    async def revoke_key(self, tenant_id: str, key_id: str) -> bool:
        revoked = await self._scripts["revoke_key"](
            keys=[self._key_record(api_keys.check_key_id(key_id)), self._key_set(tenant_id)],
            args=[tenant_id, key_id],
        )
        if revoked == -1:
            raise KeyOfAnotherTenant(f"key {key_id!r} is not tenant {tenant_id!r}'s")
        return bool(revoked)

    @_fails_closed
    async def authenticate(self, plaintext: str) -> str:
        record = self._key_record(api_keys.key_id_of(plaintext))
        tenant_id, key_hash = await self._redis.hmget(record, ["tenant_id", "key_hash"])
        if tenant_id is None or key_hash is None:
            raise AuthFailed("unknown or revoked API key")
        if not api_keys.key_matches(plaintext, decoded(key_hash)):
            raise AuthFailed("unknown or revoked API key")
        return decoded(tenant_id)

    @_fails_closed
    async def admit_job(
        self, tenant_id: str, job_id: str, num_nodes: int, *, ttl_s: float = 3600.0
    ) -> bool:
        check_id("job_id", job_id)
        check_count("num_nodes", num_nodes)
        reply = await self._quota_script(
            "admit_job", tenant_id, job_id, num_nodes, check_ttl(ttl_s)
        )
        return verdict_of_admission(tenant_id, num_nodes, reply)

    @_fails_closed
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
        check_id("job_id", job_id)
        check_count("num_nodes", num_nodes)
        check_id("call_id", call_id)
        check_count("tokens", tokens)
        reply = await self._quota_script(
            "admit_and_reserve",
            tenant_id,
            job_id,
            num_nodes,
            check_ttl(ttl_s),
            call_id,
            tokens,
            check_ttl(call_ttl_s),
        )
        return held_after_admission(tenant_id, num_nodes, call_id, tokens, reply)

    @_fails_closed
    async def finish_job(self, tenant_id: str, job_id: str) -> bool:
        return bool(await self._redis.zrem(self._tenant_keys(tenant_id)[7], job_id))

    @_fails_closed
    async def reserve(self, tenant_id: str, call_id: str, tokens: int, ttl_s: float) -> Reservation:
        check_id("call_id", call_id)
        check_count("tokens", tokens)
        reply = await self._quota_script("reserve", tenant_id, call_id, tokens, check_ttl(ttl_s))
        return reservation_from(tenant_id, call_id, tokens, reply)

    @_fails_closed
    async def settle(
        self,
        tenant_id: str,
        call_id: str,
        input_tokens: int,
        output_tokens: int,
        *,
        finish_job: str | None = None,
    ) -> bool:
        check_id("call_id", call_id)
        check_count("input_tokens", input_tokens)
        check_count("output_tokens", output_tokens)
        job = "" if finish_job is None else check_id("job_id", finish_job)
        return bool(
            await self._quota_script("settle", tenant_id, call_id, input_tokens, output_tokens, job)
        )

    @_fails_closed
    async def release(self, tenant_id: str, call_id: str) -> bool:
        check_id("call_id", call_id)
        return bool(await self._quota_script("release", tenant_id, call_id))

    @_fails_closed
    async def renew(
        self,
        tenant_id: str,
        *,
        calls: Sequence[str] = (),
        jobs: Sequence[str] = (),
        ttl_s: float,
    ) -> list[str]:
        call_ids, job_ids = check_ids("calls", calls), check_ids("jobs", jobs)
        ttl = check_ttl(ttl_s)
        lost = await self._quota_script("renew", tenant_id, ttl, len(call_ids), *call_ids, *job_ids)
        return [decoded(call_id) for call_id in lost]

    @_fails_closed
    async def usage(self, tenant_id: str) -> Usage:
        return usage_from(tenant_id, await self._quota_script("usage", tenant_id))

    async def _quota_script(self, name: str, tenant_id: str, *args: str | int | float) -> Any:
        memory = repr(CLOSED_CALL_MEMORY_S)
        argv = [memory, *(repr(a) if isinstance(a, float) else a for a in args)]
        return await self._scripts[name](keys=self._tenant_keys(tenant_id), args=argv)

    @property
    def _registry(self) -> str:
        return f"{self._prefix}:tenants"

    def _keys_of(self, tenant_id: str) -> tuple[str, ...]:
        return tuple(f"{self._prefix}:{{{tenant_id}}}:{name}" for name in _TENANT_KEYS)

    def _tenant_key(self, tenant_id: str) -> str:
        return self._tenant_keys(tenant_id)[0]

    def _key_set(self, tenant_id: str) -> str:
        return f"{self._prefix}:{{{tenant_id}}}:keys"

    def _key_record(self, key_id: str) -> str:
        return f"{self._prefix}:key:{key_id}"

    def _reply_key(self) -> str:
        """Where a change's reply is kept under a nonce of its own: sent again after its reply
        was lost, it is answered as it ran (tenants/lua/_lib.lua, `replied`)."""
        return f"{self._prefix}:reply:{secrets.token_hex(16)}"
