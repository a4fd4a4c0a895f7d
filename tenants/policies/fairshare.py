"""Virtual-time tags of a self-clocked GPS fair share: every active job's ideal finish.

Fluid model: the work the real system does (KV token-time) is shared among the GPS-active tenants
in proportion to their weights, and a tenant's part equally among its GPS-active jobs (processor
sharing); per-job rate caps are ignored here (the reference, `bench/sim/gps.py`, has them). The
system virtual time V advances by work / (sum of the GPS-active tenants' weights), so a tenant that
stays active receives `weight * dV` whatever the others do. A job's tag is the V at which it would
finish under this sharing if nothing more arrived: `F_j = V + S_j / w_T` with
`S_j = sum_k min(g_k, g_j)` over its tenant's jobs k, g being the GPS-remaining costs. Tags are
invariant while V advances; they change only when the tenant's own jobs change (arrival, re-keyed
cost, weight). Invariants: a tenant's GPS-remaining costs g are >= 0 and refer to its `v_ref`; its
`total` is their sum; a job that left the real system (a ghost) keeps its share until its g
drains, as under GPS; every live job with g > 0 has the tag its tenant's state implies, once the
tenants whose state changed since their tags were last read are re-tagged (`tag` does so first:
a burst of re-keyed costs, a backlog re-planned or an overrunning call charged token by token,
sorts each tenant's jobs once, not once a change). Each
tenant's `lead` is the real system's service to its jobs less GPS's up to its `v_ref` (reset with
the tenant's share when GPS holds nothing more of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

_RELATIVE_TOLERANCE = 1e-9


@dataclass(slots=True)
class _TenantShare:
    tenant_id: str
    weight: float
    v_ref: float  # the V at which `remaining` is exact
    remaining: dict[str, float] = field(default_factory=dict)  # job id -> GPS-remaining cost
    ghosts: set[str] = field(default_factory=set)  # jobs gone from the real system
    total: float = 0.0
    lead: float = 0.0  # the real system's service to the tenant's jobs less GPS's

    @property
    def last_finish(self) -> float:
        return self.v_ref + self.total / self.weight


def _drain(remaining: dict[str, float], amount: float) -> None:
    """Processor sharing: spread `amount` of service equally over the jobs with cost left."""
    if amount <= 0:
        return
    live = sorted((g, job) for job, g in remaining.items() if g > 0)
    if not live:
        return
    level = 0.0
    for i, (g, _) in enumerate(live):
        step = (g - level) * (len(live) - i)
        if amount < step:
            level += amount / (len(live) - i)
            break
        amount -= step
        level = g
    tolerance = _RELATIVE_TOLERANCE * max(1.0, live[-1][0])
    for g, job in live:
        remaining[job] = g - level if g - level > tolerance else 0.0


def _finish_tags(share: _TenantShare) -> dict[str, float]:
    """Tags of the tenant's jobs with cost left, from its state at `v_ref`."""
    live = sorted((g, job) for job, g in share.remaining.items() if g > 0)
    tags: dict[str, float] = {}
    served_before = 0.0
    for i, (g, job) in enumerate(live):
        tags[job] = share.v_ref + (served_before + g * (len(live) - i)) / share.weight
        served_before += g
    return tags


class FairShareClock:
    """Self-clocked GPS over tenants by weight and their jobs equally; yields finish tags."""

    def __init__(self) -> None:
        self.v = 0.0
        self._pending_work = 0.0  # served but not yet spread: tags do not depend on it
        self._shares: dict[str, _TenantShare] = {}
        self._tenant_of: dict[str, str] = {}  # live or ghost job id -> tenant id
        self._tags: dict[str, float] = {}  # live job id -> tag
        self._costs: dict[str, float] = {}  # live job id -> its whole cost, as charged
        self._dirty: set[str] = set()  # tenants whose jobs' tags wait for `_retag`

    def tag(self, job_id: str) -> float:
        if self._dirty:
            self._retag_dirty()
        return self._tags[job_id]

    def cost(self, job_id: str) -> float:
        return self._costs[job_id]

    def live_jobs(self) -> set[str]:
        return set(self._tags)

    def add_job(self, job_id: str, tenant_id: str, weight: float, cost: float) -> None:
        assert job_id not in self._tenant_of
        self._apply_work()
        if tenant_id in self._shares:
            self._sync(self._shares[tenant_id])
        share = self._shares.setdefault(tenant_id, _TenantShare(tenant_id, weight, self.v))
        share.weight = weight
        share.remaining[job_id] = max(0.0, cost)
        share.total += share.remaining[job_id]
        self._tenant_of[job_id] = tenant_id
        self._tags[job_id] = self.v
        self._costs[job_id] = cost
        self._dirty.add(tenant_id)

    def charge(self, job_id: str, delta: float) -> None:
        """Re-key: the job's cost changed by `delta` (the truth, or an overrun charged at once)."""
        self._apply_work()
        share = self._shares[self._tenant_of[job_id]]
        self._sync(share)
        before = share.remaining[job_id]
        share.remaining[job_id] = max(0.0, before + delta)
        share.total += share.remaining[job_id] - before
        self._costs[job_id] += delta
        if share.remaining[job_id] == 0.0:  # GPS is done with it: its tag is V at the latest
            self._tags[job_id] = min(self._tags[job_id], self.v)
        self._dirty.add(share.tenant_id)

    def serve(self, job_id: str, work: float) -> None:
        """The real system did `work` KV token-time for the job: GPS serves the same amount."""
        work = max(0.0, work)
        self._pending_work += work
        self._shares[self._tenant_of[job_id]].lead += work

    def lead(self, tenant_id: str, committed: float = 0.0) -> float:
        """How far GPS lags the real system's service to the tenant, in virtual time: the KV
        token-time served to its jobs (and `committed` more, counted as served) beyond what GPS
        served them, over its weight (negative: GPS is ahead); 0 for a tenant GPS holds nothing
        of (it starts afresh)."""
        self._apply_work()
        share = self._shares.get(tenant_id)
        if share is None:
            return 0.0
        # what `_sync` would drain now: PS spreads it over the tenant's jobs, all of it while
        # they have cost left
        drained = min(share.weight * (self.v - share.v_ref), share.total)
        return (share.lead + committed - drained) / share.weight

    def virtual_time(self, work: float) -> float:
        """How far V moves while the real system serves `work` to the GPS-active tenants."""
        self._apply_work()
        weights = sum(s.weight for s in self._shares.values() if s.last_finish > self.v)
        return work / weights if weights else 0.0

    def release(self, job_id: str) -> None:
        """The job left the real system; GPS keeps serving what it had left."""
        self._apply_work()
        share = self._shares[self._tenant_of[job_id]]
        self._sync(share)
        del self._tags[job_id], self._costs[job_id]
        share.ghosts.add(job_id)
        self._drop_finished_ghosts(share)

    def _apply_work(self) -> None:
        work, self._pending_work = self._pending_work, 0.0
        while work > 0:
            active = [s for s in self._shares.values() if s.last_finish > self.v]
            if not active:
                return  # GPS would be idle: nothing to serve
            weights = sum(s.weight for s in active)
            next_finish = min(s.last_finish for s in active)
            needed = (next_finish - self.v) * weights
            if work < needed:
                self.v += work / weights
                return
            work -= needed
            self.v = next_finish
            for share in active:
                if share.last_finish <= self.v:
                    self._sync(share)

    def _sync(self, share: _TenantShare) -> None:
        if share.v_ref == self.v:
            return  # nothing served since: its state is exact
        _drain(share.remaining, share.weight * (self.v - share.v_ref))
        share.v_ref = self.v
        left = sum(share.remaining.values())
        if left and self.v + left / share.weight <= self.v:
            # below V's resolution (a long uptime makes V large): GPS is done with it, and a
            # share whose finish no longer passes V would never be synced, nor dropped, again
            share.remaining = dict.fromkeys(share.remaining, 0.0)
        before, share.total = share.total, sum(share.remaining.values())
        share.lead -= before - share.total
        self._drop_finished_ghosts(share)

    def _drop_finished_ghosts(self, share: _TenantShare) -> None:
        for job_id in [j for j in share.ghosts if share.remaining[j] == 0.0]:
            share.ghosts.remove(job_id)
            del share.remaining[job_id], self._tenant_of[job_id]
        if not share.remaining:
            del self._shares[share.tenant_id]

    def _retag_dirty(self) -> None:
        for tenant_id in self._dirty:
            share = self._shares.get(tenant_id)  # gone once GPS holds nothing of it
            if share is not None:
                self._retag(share)
        self._dirty.clear()

    def _retag(self, share: _TenantShare) -> None:
        share.total = sum(share.remaining.values())  # what the changes added, without drift
        for job_id, tag in _finish_tags(share).items():
            if job_id not in share.ghosts:
                self._tags[job_id] = tag

    def check_invariants(self) -> None:
        """Assert the clock's invariants (for tests and debugging)."""
        self._retag_dirty()
        for tenant, share in self._shares.items():
            assert share.tenant_id == tenant and share.remaining and share.weight > 0
            assert share.ghosts <= set(share.remaining)
            assert all(g >= 0 for g in share.remaining.values())
            assert abs(share.total - sum(share.remaining.values())) <= 1e-6 * max(1, share.total)
            assert all(self._tenant_of[j] == tenant for j in share.remaining)
            assert all(share.remaining[j] > 0 for j in share.ghosts)
            live = set(share.remaining) - share.ghosts
            assert all(j in self._tags for j in live)
            for job_id, tag in _finish_tags(share).items():
                if job_id in live:
                    assert abs(tag - self._tags[job_id]) <= 1e-6 * max(1.0, abs(tag)), job_id
        assert set(self._tenant_of) == {j for s in self._shares.values() for j in s.remaining}
        assert set(self._tags) == set(self._costs) <= set(self._tenant_of)
