"""Least attained service along the critical path (Autellix's ATLAS, used by Agentix).

Non-clairvoyant: no prediction is used. A node's attained service is the KV token-time its call
has used so far, `kv_token_time(prompt, generated)`; a job's attained service is the largest sum
of it along any path of its DAG (its critical path so far). The job with the least goes first with
all its ready calls (ties: arrival, then job id); a running call's priority is its job's attained
service. Anti-starvation, as in Autellix: a job whose oldest ready call has waited longer than
`starvation_wait` seconds goes before all others, oldest first. Invariant: `_served[job]` holds
the attained service of each started or finished node of the job, and `_attained[job]`, when
present, is the critical-path maximum of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from tenants.policies.base import ReadyCall, kv_token_time
from tenants.policies.bookkeeping import ActiveJob, BookPolicy, OrderKey, RunningCall

# lowers a starving job's wait start (seconds) below any attained service (KV token-time, >= 0)
# in a shared pool's order; at this size a double still tells waits 0.1 ms apart
STARVING_OFFSET = -1e12


class LasPolicy(BookPolicy):
    name = "las"
    by_weight = False

    def __init__(self, *, starvation_wait: float | None = 60.0) -> None:
        if starvation_wait is not None and not starvation_wait > 0:
            raise ValueError(f"starvation_wait must be > 0 or None, got {starvation_wait}")
        super().__init__()
        self._starvation_wait = starvation_wait
        self._served: dict[str, dict[str, float]] = {}
        self._attained: dict[str, float] = {}  # cache; absent when stale

    def attained_service(self, job_id: str) -> float:
        attained = self._attained.get(job_id)
        if attained is None:
            attained = self._attained[job_id] = self._critical_path(self._job(job_id))
        return attained

    def _job_order(self, job: ActiveJob, now: float) -> OrderKey:
        waited_since = self._starving_since(job, now)
        if waited_since is not None:
            return (0.0, waited_since, job.info.arrival, job.info.job_id)
        return (1.0, self.attained_service(job.info.job_id), job.info.arrival, job.info.job_id)

    def _starving_since(self, job: ActiveJob, now: float) -> float | None:
        """When the job's oldest ready call became ready, if it has waited past the limit."""
        waited_since = self._ready_at[next(iter(job.ready))]
        if self._starvation_wait is not None and now - waited_since > self._starvation_wait:
            return waited_since
        return None

    def _job_priority(self, job: ActiveJob) -> float:
        return self.attained_service(job.info.job_id)

    def pool_offsets(self, job_ids: Iterable[str], now: float) -> dict[str, float]:
        """Each job's attained service: the gateways that share a pool serve the least attained
        first as one. A starving job comes before them all, the longest starving first: at when
        it began to wait, lowered by `STARVING_OFFSET`."""
        offsets = {}
        for job_id in job_ids:
            job = self._job(job_id)
            waited_since = self._starving_since(job, now) if job.ready else None
            if waited_since is not None:
                offsets[job_id] = waited_since + STARVING_OFFSET
            else:
                offsets[job_id] = self.attained_service(job_id)
        return offsets

    def _standing(self, key: OrderKey) -> object:
        return key[0]  # a starving job's precedence is its own (see `_job_order`)

    def _job_added(self, job: ActiveJob, now: float) -> None:
        self._served[job.info.job_id] = {}
        self._attained[job.info.job_id] = 0.0

    def _call_ready(self, job: ActiveJob, call: ReadyCall, now: float) -> None:
        self._served[call.job_id][call.node_id] = 0.0

    def _call_progressed(self, job: ActiveJob, run: RunningCall, previous: int, now: float) -> None:
        served = kv_token_time(run.call.prompt_tokens, run.output_tokens)
        self._served[run.call.job_id][run.call.node_id] = served
        self._attained.pop(run.call.job_id, None)

    def _call_finished(self, job: ActiveJob, run: RunningCall, prompt: int, now: float) -> None:
        served = kv_token_time(prompt, run.output_tokens)
        self._served[run.call.job_id][run.call.node_id] = served
        self._attained.pop(run.call.job_id, None)

    def _job_removed(self, job: ActiveJob, now: float) -> None:
        del self._served[job.info.job_id]
        self._attained.pop(job.info.job_id, None)

    def _critical_path(self, job: ActiveJob) -> float:
        return job.longest_path(self._served[job.info.job_id])

    def _check_order(self) -> None:
        assert set(self._served) == set(self._jobs) >= set(self._attained)
        for job_id, served in self._served.items():
            job = self._jobs[job_id]
            assert set(served) == set(job.started) | set(job.done)
            if job_id in self._attained:
                assert self._attained[job_id] == self._critical_path(job)
