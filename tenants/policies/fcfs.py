"""First come, first served: vLLM's default order, the baseline every policy is compared to.

Ready calls are served by their job's arrival, then by when they became ready, then by call id
(a total order). A running call's priority is its job's arrival, so the engine preempts the latest
job's calls first. Invariant: none beyond the book's; the order is a pure function of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from tenants.policies.bookkeeping import ActiveJob, BookPolicy, OrderKey


class FcfsPolicy(BookPolicy):
    name = "fcfs"
    by_weight = False

    def _job_order(self, job: ActiveJob, now: float) -> OrderKey:
        first = next(iter(job.ready))
        return (job.info.arrival, self._ready_seq[first], first)

    def _job_priority(self, job: ActiveJob) -> float:
        return job.info.arrival

    def pool_offsets(self, job_ids: Iterable[str], now: float) -> dict[str, float]:
        """Each job's arrival: the gateways that share a pool serve it first come, first served
        as one (their clocks agree as well as the hosts' wall clocks do)."""
        return {job_id: self._job(job_id).info.arrival for job_id in job_ids}
