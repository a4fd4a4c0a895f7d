"""Shortest remaining job first with oracle lengths: how fast an order could be, not a fair one.

A job's remaining cost is the KV token-time of its unfinished nodes at their true output lengths
(`true_output`, required), less what its running calls have already used. The job with the least
remaining cost goes first with all its ready calls (ties: arrival, then job id), and its running
calls' priority is that cost. A reference for studies: a steady stream of small jobs can starve a
large one. Invariant: `_left[job][node]` is the node's true cost not yet served, and
`_remaining[job]` is their sum.
"""

from __future__ import annotations

from tenants.policies.base import ReadyCall, kv_token_time
from tenants.policies.bookkeeping import ActiveJob, BookPolicy, OrderKey, RunningCall
from tenants.policies.errors import InvalidJob


class SjfOraclePolicy(BookPolicy):
    name = "sjf-oracle"
    by_weight = False

    def __init__(self) -> None:
        super().__init__()
        self._left: dict[str, dict[str, float]] = {}
        self._remaining: dict[str, float] = {}

    def remaining_cost(self, job_id: str) -> float:
        return self._remaining[job_id]

    def _job_order(self, job: ActiveJob, now: float) -> OrderKey:
        return (self._remaining[job.info.job_id], job.info.arrival, job.info.job_id)

    def _job_priority(self, job: ActiveJob) -> float:
        return self._remaining[job.info.job_id]

    def _job_added(self, job: ActiveJob, now: float) -> None:
        left: dict[str, float] = {}
        for node in job.info.nodes:
            if node.true_output is None:
                raise InvalidJob(f"job {job.info.job_id}: sjf-oracle needs every true_output")
            left[node.node_id] = kv_token_time(node.prompt_tokens, node.true_output)
        self._left[job.info.job_id] = left
        self._remaining[job.info.job_id] = sum(left.values())

    def _call_ready(self, job: ActiveJob, call: ReadyCall, now: float) -> None:
        self._set_left(job, call.node_id, self._true_cost(job, call.node_id, call.prompt_tokens))

    def _call_progressed(self, job: ActiveJob, run: RunningCall, previous: int, now: float) -> None:
        call = run.call
        whole = self._true_cost(job, call.node_id, call.prompt_tokens)
        served = kv_token_time(call.prompt_tokens, run.output_tokens)
        self._set_left(job, call.node_id, max(0.0, whole - served))

    def _call_finished(self, job: ActiveJob, run: RunningCall, prompt: int, now: float) -> None:
        self._set_left(job, run.call.node_id, 0.0)

    def _job_removed(self, job: ActiveJob, now: float) -> None:
        del self._left[job.info.job_id], self._remaining[job.info.job_id]

    @staticmethod
    def _true_cost(job: ActiveJob, node_id: str, prompt_tokens: int) -> float:
        true_output = job.nodes[node_id].true_output
        assert true_output is not None
        return kv_token_time(prompt_tokens, true_output)

    def _set_left(self, job: ActiveJob, node_id: str, cost: float) -> None:
        left = self._left[job.info.job_id]
        self._remaining[job.info.job_id] += cost - left[node_id]
        left[node_id] = cost

    def _check_order(self) -> None:
        assert set(self._left) == set(self._remaining) == set(self._jobs)
        for job_id, left in self._left.items():
            assert all(cost >= 0 for cost in left.values())
            assert all(left[node] == 0 for node in self._jobs[job_id].done)
            total = sum(left.values())
            assert abs(total - self._remaining[job_id]) <= 1e-6 * max(1.0, total)
