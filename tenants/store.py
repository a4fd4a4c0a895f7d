"""The quota store contract: tenant registry, API keys, job admission and call reservations.

Two implementations keep it: `RedisQuotaStore` (shared by every gateway process, atomic through
Lua scripts) and `MemoryQuotaStore` (one process, an injected clock). One contract test suite runs
on both. Per tenant they keep these invariants:

- every call id is reserved at most once, closed (settled, released or reclaimed) at most once
  and settled at most once; a repeated reserve returns the open reservation and charges nothing;
  a closed id is remembered for `CLOSED_CALL_MEMORY_S` and cannot be reserved again
  (`CallClosed`);
- the token bucket and today's budget are charged the reserved tokens at reserve and corrected to
  the actual tokens at settle (refund `reserved - actual`; a negative refund charges the excess);
  release and reclaim refund everything; refunds never lift the bucket above its capacity;
- reservations and job admissions are leases: `renew` pushes their expiry on while the work
  runs; a reservation past `expires_at` is reclaimed lazily by the next operation on that
  tenant, so a crashed gateway leaks nothing, and an admitted job past its expiry stops counting;
- a settle is never lost to reclamation: settling a reclaimed call (a late settle, within
  `CLOSED_CALL_MEMORY_S` of the reclaim) charges its actual tokens now (bucket, today's budget,
  usage) and returns True; releasing a reclaimed call changes nothing and returns False (a late
  settle may still follow); settling or releasing a call already settled, released or unknown
  charges nothing and returns False;
- settled usage (`input_tokens`, `output_tokens`, `settled_calls`) counts exactly the settles
  that returned True.

Call and job ids live in the tenant's own namespace: one tenant can neither see nor close
another tenant's calls or jobs. Reserve and admit_job raise QuotaExceeded; when the store cannot
be reached every method raises QuotaUnavailable (fail closed), whose message tells the caller
nothing about the store's address or errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, Self

from tenants.models import ApiKey, Reservation, Tenant, TenantQuota, Usage


class ClosesOnExit:
    """The async context manager every store is: `async with` closes it on the way out."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        raise NotImplementedError


class QuotaStore(Protocol):
    async def create_tenant(
        self, tenant_id: str, display_name: str, quota: TenantQuota
    ) -> Tenant: ...

    async def get_tenant(self, tenant_id: str) -> Tenant: ...

    async def list_tenants(self, after: str = "", limit: int = 0) -> list[Tenant]:
        """The tenants whose id sorts after `after`, sorted by id, at most `limit` of them (0:
        all): a page reads the records of its own tenants alone."""
        ...

    async def update_tenant(
        self,
        tenant_id: str,
        *,
        display_name: str | None = None,
        quota: TenantQuota | None = None,
    ) -> Tenant: ...

    async def delete_tenant(self, tenant_id: str) -> None:
        """Remove the tenant, its keys, reservations, jobs and usage in one atomic step: no key
        of a deleted tenant keeps working."""
        ...

    async def issue_key(self, tenant_id: str) -> tuple[str, str]:
        """A new key for the tenant: `(key_id, plaintext)`; only its hash is stored. Atomic with
        the tenant check: a key is never stored for a missing tenant."""
        ...

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        """The tenant's live keys, sorted by creation time."""
        ...

    async def revoke_key(self, tenant_id: str, key_id: str) -> bool:
        """Revoke the tenant's key (its record and its place in the tenant's key set) in one
        atomic step. True when this revoked it; False when no key of that id is live (revoked
        already, perhaps by a call whose reply was lost, or never issued): what follows a
        revocation may still be owed. KeyOfAnotherTenant when the live key of that id is another
        tenant's: it is left alone. RequestInvalid for an id no key has."""
        ...

    async def authenticate(self, plaintext: str) -> str:
        """The tenant id a key belongs to; AuthFailed when malformed, unknown or wrong."""
        ...

    async def admit_job(
        self, tenant_id: str, job_id: str, num_nodes: int, *, ttl_s: float = 3600.0
    ) -> bool:
        """Count the job against max_queued_jobs until finished or `ttl_s` has passed; check
        max_nodes_per_job. True when admitted now, False when it already was."""
        ...

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
        """admit_job, then reserve for the job's first call, in one atomic step: a refused
        admission raises and reserves nothing; a call that cannot be reserved now (a limit,
        or a closed id) leaves the job admitted and returns None."""
        ...

    async def finish_job(self, tenant_id: str, job_id: str) -> bool:
        """True when the job was queued (and now is not)."""
        ...

    async def reserve(
        self, tenant_id: str, call_id: str, tokens: int, ttl_s: float
    ) -> Reservation: ...

    async def settle(
        self,
        tenant_id: str,
        call_id: str,
        input_tokens: int,
        output_tokens: int,
        *,
        finish_job: str | None = None,
    ) -> bool:
        """True when this settled the call: it was open, or reclaimed and not settled yet (a
        late settle, charged now). False when it was already settled, released or unknown. With
        `finish_job`, that job is finished in the same atomic step, whatever the settle finds (a
        job's last call closes both at once)."""
        ...

    async def release(self, tenant_id: str, call_id: str) -> bool:
        """True when this released an open call; False when it was not open (a reclaimed call
        is left for its late settle)."""
        ...

    async def renew(
        self,
        tenant_id: str,
        *,
        calls: Sequence[str] = (),
        jobs: Sequence[str] = (),
        ttl_s: float,
    ) -> list[str]:
        """Renew leases in one atomic step: each named open reservation and each named admitted
        job expires at now + `ttl_s` instead. Returns the named call ids that were not open
        (reclaimed, closed or unknown; all of them for an unknown tenant): those leases were
        lost. Job ids not admitted are skipped; nothing is opened, admitted or charged. At
        most `MAX_RENEW_IDS` ids in each list (RequestInvalid)."""
        ...

    async def usage(self, tenant_id: str) -> Usage: ...

    async def aclose(self) -> None: ...


def ids_after(tenant_ids: Iterable[str], after: str) -> list[str]:
    """The ids a `list_tenants` page is taken from: those after `after`, sorted."""
    return sorted(t for t in tenant_ids if t > after)
