"""Virtual Token Counter (Sheng et al., OSDI'24): the backlogged tenant with least service first.

Each tenant has a counter of the service it received, in weighted tokens divided by its weight:
`w_p` per prompt token when a call is dispatched, `w_q` per output token as it is generated. The
next call is the oldest ready call (job arrival, then readiness) of the backlogged tenant with the
lowest counter. A tenant is backlogged while it has a ready or running call. Counter lift: when a
tenant becomes backlogged its counter rises to the lowest counter among the backlogged tenants (to
the counter of the last tenant that stopped being backlogged when there are none), so idle time
banks no credit. Invariant: `_backlog[t]` is the number of ready plus running calls of tenant t,
and no tenant is listed with zero. Bound: between two continuously backlogged tenants the gap in
weighted service stays below one prompt charge plus the output charges of a full batch.
"""

from __future__ import annotations

from collections import Counter

from tenants.policies.base import ReadyCall
from tenants.policies.bookkeeping import ActiveJob, BookPolicy, OrderKey, RunningCall


class VtcPolicy(BookPolicy):
    name = "vtc"
    by_weight = True

    def __init__(self, *, prompt_weight: float = 1.0, output_weight: float = 2.0) -> None:
        super().__init__()
        self._w_p = prompt_weight
        self._w_q = output_weight
        self._counter: dict[str, float] = {}
        self._weight: dict[str, float] = {}
        self._backlog: Counter[str] = Counter()
        self._last_left: float | None = None  # counter of the last tenant to stop being backlogged

    def counter(self, tenant_id: str) -> float:
        """The tenant's virtual token counter (0 for a tenant never seen)."""
        return self._counter.get(tenant_id, 0.0)

    def _job_order(self, job: ActiveJob, now: float) -> OrderKey:
        tenant = job.info.tenant_id
        first = next(iter(job.ready))
        return (self._counter[tenant], tenant, job.info.arrival, self._ready_seq[first], first)

    def _job_priority(self, job: ActiveJob) -> float:
        return self._counter[job.info.tenant_id]

    def _job_added(self, job: ActiveJob, now: float) -> None:
        self._weight[job.info.tenant_id] = job.info.weight
        self._counter.setdefault(job.info.tenant_id, 0.0)

    def _call_ready(self, job: ActiveJob, call: ReadyCall, now: float) -> None:
        tenant = call.tenant_id
        if tenant not in self._backlog:
            backlogged = [self._counter[t] for t in self._backlog]
            floor = min(backlogged) if backlogged else self._last_left
            if floor is not None:
                self._counter[tenant] = max(self._counter[tenant], floor)
        self._backlog[tenant] += 1

    def _call_dispatched(self, job: ActiveJob, run: RunningCall, now: float) -> None:
        self._charge(run.call.tenant_id, self._w_p * run.call.prompt_tokens)

    def _call_progressed(self, job: ActiveJob, run: RunningCall, previous: int, now: float) -> None:
        self._charge(run.call.tenant_id, self._w_q * (run.output_tokens - previous))

    def _call_finished(self, job: ActiveJob, run: RunningCall, prompt: int, now: float) -> None:
        self._charge(run.call.tenant_id, self._w_p * (prompt - run.call.prompt_tokens))
        self._leave(run.call.tenant_id, 1)

    def _job_removed(self, job: ActiveJob, now: float) -> None:
        calls = len(job.ready) + len(job.running)
        if calls:
            self._leave(job.info.tenant_id, calls)

    def _charge(self, tenant: str, tokens: float) -> None:
        self._counter[tenant] += tokens / self._weight[tenant]

    def _leave(self, tenant: str, calls: int) -> None:
        self._backlog[tenant] -= calls
        assert self._backlog[tenant] >= 0
        if self._backlog[tenant] == 0:
            del self._backlog[tenant]
            self._last_left = self._counter[tenant]

    def _check_order(self) -> None:
        expected: Counter[str] = Counter()
        for job in self._jobs.values():
            expected[job.info.tenant_id] += len(job.ready) + len(job.running)
        assert +expected == self._backlog
        assert all(t in self._counter for t in self._backlog)
