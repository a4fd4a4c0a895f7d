"""The calls a dispatch core holds, by state, and the tenants they belong to.

A call is in exactly one of `ready` (waiting for the policy to show it and a backend to have
room), `taking` (chosen, its room promised, while the caller asks for its grant or reserves its
quota) and `running` (sent to its backend, until it ends); `jobs` holds each active job's running
calls. Per tenant the book keeps its weight (as its last job said), how many jobs it has here,
and until when its own quota holds its calls back; a tenant's entries go with its last job, so a
churn of tenants does not grow them, except a quota hold that outlasts it. The queries answer
the core's decisions (`gateway.dispatch_core`, `gateway.yields`) in proportion to what they ask
about. Pure: no I/O and no clock (`now` is passed in).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from typing import Generic, TypeVar

from gateway.backends.base import BackendCapacity
from gateway.core_call import CoreCall
from gateway.ready_calls import ReadyCalls
from gateway.slot_share import weighted_shares
from tenants.policies import JobInfo

T = TypeVar("T")


class CallBook(Generic[T]):
    def __init__(self) -> None:
        self.ready: ReadyCalls[CoreCall[T]] = ReadyCalls()
        self.taking: dict[str, CoreCall[T]] = {}
        self.running: dict[str, CoreCall[T]] = {}
        self.jobs: dict[str, dict[str, CoreCall[T]]] = {}  # active job -> its running calls
        self.weights: dict[str, float] = {}
        self._tenant_jobs: Counter[str] = Counter()
        self._tenant_of_job: dict[str, str] = {}
        # tenant -> until when its own quota holds its calls back (once released, when it
        # did): that wait is the tenant's, not the gateway's (`waiting_since`)
        self.quota_until: dict[str, float] = {}
        # jobs whose ready calls wait unshown, and unpublished, until the caller lets them go
        # (their replica's lease on them may have lapsed)
        self.held_jobs: set[str] = set()

    # --- jobs -----------------------------------------------------------------------------

    def add_job(self, info: JobInfo) -> None:
        self.jobs[info.job_id] = {}
        self._tenant_of_job[info.job_id] = info.tenant_id
        self.weights[info.tenant_id] = info.weight
        self._tenant_jobs[info.tenant_id] += 1

    def remove_job(self, job_id: str, now: float) -> bool:
        """Forget the job's place (False: it was not here); its calls are the caller's."""
        if self.jobs.pop(job_id, None) is None:
            return False
        self.held_jobs.discard(job_id)
        tenant = self._tenant_of_job.pop(job_id)
        self._tenant_jobs[tenant] -= 1
        if not self._tenant_jobs[tenant]:
            del self._tenant_jobs[tenant], self.weights[tenant]
            if self.quota_until.get(tenant, -math.inf) <= now:
                self.quota_until.pop(tenant, None)
        return True

    def has_tenant(self, tenant_id: str) -> bool:
        """Whether the tenant has a job here."""
        return tenant_id in self._tenant_jobs

    def weight(self, tenant_id: str) -> float:
        return self.weights.get(tenant_id, 1.0)

    def waiting_of(self, job_id: str) -> list[CoreCall[T]]:
        """The job's ready calls and those being taken, taken out of the book."""
        gone = self.ready.of_job(job_id)
        for entry in gone:
            del self.ready[entry.call.call_id]
        for call_id in [c for c, e in self.taking.items() if e.call.job_id == job_id]:
            gone.append(self.taking.pop(call_id))  # few: the calls being sent at once
        return gone

    # --- tenants --------------------------------------------------------------------------

    def quota_holds(self, tenant_id: str, now: float) -> bool:
        """Whether the tenant's own quota holds its calls back now."""
        return self.quota_until.get(tenant_id, -math.inf) > now

    def unheld_tenants(self, now: float) -> list[str]:
        """The tenants with a ready call that their own quota does not hold back now."""
        return [t for t in self.ready.tenants() if not self.quota_holds(t, now)]

    def waiting_since(self, entry: CoreCall[T], ready_at: float) -> float:
        """When the call, ready since `ready_at`, began to wait for the gateway: once ready and
        no longer held back by its tenant's own quota. A ready call reads its tenant's hold as
        it is now (it may be in the future: held still); a call taken or sent, the hold it left
        the ready calls under, so that a later refusal of another of its tenant's calls does
        not move the start of a wait that goes on."""
        if entry.call.call_id in self.ready:
            return max(ready_at, self.quota_until.get(entry.call.tenant_id, -math.inf))
        return max(ready_at, entry.quota_hold)

    def leave_ready(self, entry: CoreCall[T], now: float) -> None:
        """The call leaves the ready calls to be taken or sent: the quota hold it waited under
        is fixed (none lasts past `now`: it is sent)."""
        del self.ready[entry.call.call_id]
        entry.quota_hold = min(self.quota_until.get(entry.call.tenant_id, -math.inf), now)

    def sendable(self, tenant_id: str) -> int:
        """The tenant's ready calls but those of its held jobs (which send nothing until let
        go: a tenant with only those is not light)."""
        count = self.ready.count(tenant_id)
        if self.held_jobs:
            held = (j for j in self.ready.jobs(tenant_id) if j in self.held_jobs)
            count -= sum(len(self.ready.of_job(j)) for j in held)
        return count

    def shown_jobs(self, tenant_id: str) -> Collection[str]:
        """The tenant's jobs with a ready call that are not held."""
        jobs = self.ready.jobs(tenant_id)
        return [j for j in jobs if j not in self.held_jobs] if self.held_jobs else jobs

    def active_tenants(self) -> set[str]:
        """The tenants with ready, taken or running calls."""
        return {
            *self.ready.tenants(),
            *(e.call.tenant_id for calls in (self.taking, self.running) for e in calls.values()),
        }

    def tenant_shares(
        self, capacities: Mapping[str, BackendCapacity], slots: int
    ) -> tuple[Counter[str], dict[str, float]]:
        """Each tenant's calls running or being sent on a serving backend (not those yielding
        already), and each backlogged tenant's (such calls or ready ones) share of `slots` by
        weight."""
        serving = {name for name, room in capacities.items() if room.healthy}
        running = Counter(
            e.call.tenant_id
            for calls in (self.running, self.taking)
            for e in calls.values()
            if e.backend in serving and not e.yielding
        )
        backlogged = {*running, *self.ready.tenants()}
        return running, weighted_shares(backlogged, self.weights, slots)

    def protected_tenants(self) -> set[str]:
        """The tenants with a protected call running or being sent (not yielding)."""
        return {
            e.call.tenant_id
            for calls in (self.running, self.taking)
            for e in calls.values()
            if not e.sheddable and not e.yielding
        }

    def newest(
        self, capacities: Mapping[str, BackendCapacity], which: Callable[[CoreCall[T]], bool]
    ) -> CoreCall[T] | None:
        """The newest running call that `which` picks, on a backend that serves."""
        for entry in reversed(self.running.values()):
            room = capacities.get(entry.backend)
            if which(entry) and room is not None and room.healthy:
                return entry
        return None
