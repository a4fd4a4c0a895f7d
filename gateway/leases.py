"""Quota leases: reservations and job admissions renewed while the work runs, reserves retried.

The store holds a reservation or an admitted job until it expires, so a crashed gateway leaks
nothing for longer than one lease (`ttl_s`). While this gateway runs a call or a job, `Leases`
renews it every `ttl_s / 3` in one store round trip per tenant, so a long call is never reclaimed
mid-run. A renewal that cannot reach the store is tried again at the next tick (a lease outlives
two missed ticks); a lease the store reports lost (reclaimed after a longer outage) is logged: its
settle still charges what the call used (a late settle).

`reserve_within` retries a reserve that cannot reach the store, with capped exponential backoff,
until a deadline (`retry_unavailable`, which the pool's share grant uses too); refusals
(QuotaExceeded, CallClosed) are not retried here.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup

from gateway.owned import OwnsTasks
from tenants import QuotaStore, QuotaUnavailable, Reservation
from tenants.models import MAX_RENEW_IDS

log = logging.getLogger(__name__)
T = TypeVar("T")
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0


class Leases(OwnsTasks):
    def __init__(self, store: QuotaStore, ttl_s: float) -> None:
        super().__init__()
        self.store = store
        self.ttl_s = ttl_s
        self._calls: dict[str, str] = {}  # call id -> tenant
        self._jobs: dict[str, str] = {}  # job id -> tenant

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._renew_loop)

    def hold_call(self, tenant_id: str, call_id: str) -> None:
        self._calls[call_id] = tenant_id

    def drop_call(self, call_id: str) -> None:
        self._calls.pop(call_id, None)

    def hold_job(self, tenant_id: str, job_id: str) -> None:
        self._jobs[job_id] = tenant_id

    def drop_job(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    async def _renew_loop(self) -> None:
        while True:
            await anyio.sleep(self.ttl_s / 3)
            await self.renew_all()

    async def renew_all(self) -> None:
        """Renew every held lease now, one round trip per tenant."""
        calls: defaultdict[str, list[str]] = defaultdict(list)
        jobs: defaultdict[str, list[str]] = defaultdict(list)
        for call_id, tenant in self._calls.items():
            calls[tenant].append(call_id)
        for job_id, tenant in self._jobs.items():
            jobs[tenant].append(job_id)
        for tenant in calls.keys() | jobs.keys():
            tenant_calls, tenant_jobs = calls[tenant], jobs[tenant]
            for start in range(0, max(len(tenant_calls), len(tenant_jobs)), MAX_RENEW_IDS):
                chunk = slice(start, start + MAX_RENEW_IDS)
                await self._renew(tenant, tenant_calls[chunk], tenant_jobs[chunk])

    async def _renew(self, tenant_id: str, calls: list[str], jobs: list[str]) -> None:
        try:
            lost = await self.store.renew(tenant_id, calls=calls, jobs=jobs, ttl_s=self.ttl_s)
        except QuotaUnavailable:
            log.warning("cannot renew the leases of %s: the store is unreachable", tenant_id)
            return
        except Exception:  # a tenant deleted meanwhile: its work is being cancelled
            log.exception("renewing the leases of %s", tenant_id)
            return
        for call_id in lost:
            log.warning("the reservation of %s expired while it ran", call_id)


async def reserve_within(
    store: QuotaStore,
    tenant_id: str,
    call_id: str,
    tokens: int,
    ttl_s: float,
    deadline: float,
    clock: Callable[[], float],
) -> Reservation:
    """Reserve, retrying while the store is unreachable until `deadline` (then it raises)."""
    return await retry_unavailable(
        lambda: store.reserve(tenant_id, call_id, tokens, ttl_s), QuotaUnavailable, deadline, clock
    )


async def retry_unavailable(
    attempt: Callable[[], Awaitable[T]],
    unavailable: type[Exception],
    deadline: float,
    clock: Callable[[], float],
) -> T:
    """`attempt()`, tried again with capped exponential backoff while it raises `unavailable`,
    until `deadline` (then it raises that)."""
    delay = BACKOFF_FIRST_S
    while True:
        try:
            return await attempt()
        except unavailable:
            if clock() + delay >= deadline:
                raise
        await anyio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)
