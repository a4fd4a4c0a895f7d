"""Reference GPS calculator: each job's ideal finish under a weighted fair share of KV capacity.

Fluid model (docs/GPS.md). The engine offers `capacity` KV token-slots per step. A call with prompt
p and d output tokens needs `kv_token_time(p, d)` slot-steps of service and can use at most its
mean footprint `p + (d + 1) / 2` slots a step, so alone it takes exactly d steps (a token a step).
A job can use the sum over its running calls. Water-filling shares the capacity: tenants by weight,
a tenant's part equally among its active jobs, nobody above what its calls can use, the surplus
spread over the rest; a job's part goes to its calls in proportion to their footprints. A call
starts `delay` after its last parent finished (after the job's arrival for a root): a think or
tool pause during which that branch uses nothing. Prefill is not modelled. Event-driven: rates are
constant between events (arrival, start, finish), so no time steps are simulated. Invariant: no
job is served above its demand, and the rates sum to the capacity, or to the whole demand when
that is smaller (work conservation).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tenants.policies.base import kv_token_time
from tenants.policies.dag import topological_order
from tenants.policies.errors import InvalidJob


@dataclass(frozen=True, slots=True)
class GpsCall:
    node_id: str
    parents: tuple[str, ...]
    prompt_tokens: int
    output_tokens: int
    delay: float = 0.0  # seconds between the last parent's finish (or arrival) and the start


@dataclass(frozen=True, slots=True)
class GpsJob:
    job_id: str
    tenant_id: str
    weight: float  # the tenant's weight; all jobs of a tenant must agree
    arrival: float  # seconds
    calls: tuple[GpsCall, ...]


def water_fill(capacity: float, demands: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Max-min weighted fair split of `capacity`: nobody gets more than its demand."""
    allocation = [0.0] * len(demands)
    left, weight_left = capacity, sum(weights)
    for i in sorted(range(len(demands)), key=lambda i: demands[i] / weights[i]):
        allocation[i] = min(demands[i], left * weights[i] / weight_left)
        left -= allocation[i]
        weight_left -= weights[i]
    return allocation


def gps_finish_times(
    jobs: Iterable[GpsJob], capacity: float, *, step_seconds: float = 1.0
) -> dict[str, float]:
    """Every job's ideal finish time (seconds) under the fluid fair share described above."""
    if not (capacity > 0 and math.isfinite(capacity)):
        raise ValueError(f"capacity must be finite and > 0, got {capacity}")
    if not (step_seconds > 0 and math.isfinite(step_seconds)):
        raise ValueError(f"step_seconds must be finite and > 0, got {step_seconds}")
    job_list = list(jobs)
    _validate(job_list)
    finish_steps = _FluidRun(job_list, capacity, step_seconds).run()
    return {job_id: steps * step_seconds for job_id, steps in finish_steps.items()}


def _validate(jobs: list[GpsJob]) -> None:
    weights: dict[str, float] = {}
    if len({job.job_id for job in jobs}) != len(jobs):
        raise InvalidJob("duplicate job ids")
    for job in jobs:
        if not (job.weight > 0 and math.isfinite(job.weight) and math.isfinite(job.arrival)):
            raise InvalidJob(f"job {job.job_id}: weight must be > 0 and times finite")
        if weights.setdefault(job.tenant_id, job.weight) != job.weight:
            raise InvalidJob(f"tenant {job.tenant_id}: jobs disagree on the weight")
        calls = {call.node_id: call for call in job.calls}
        if not calls or len(calls) != len(job.calls):
            raise InvalidJob(f"job {job.job_id}: no calls or duplicate node ids")
        for c in job.calls:
            if c.prompt_tokens < 0 or c.output_tokens < 0 or not 0 <= c.delay < math.inf:
                raise InvalidJob(f"job {job.job_id} node {c.node_id}: negative numbers")
        topological_order(job.job_id, {node: call.parents for node, call in calls.items()})


@dataclass(slots=True)
class _JobRun:
    job: GpsJob
    calls: dict[str, GpsCall]
    children: dict[str, list[str]]
    parents_left: dict[str, int]
    running: dict[str, float] = field(default_factory=dict)  # node -> service still needed
    calls_left: int = 0

    @classmethod
    def of(cls, job: GpsJob) -> _JobRun:
        calls = {c.node_id: c for c in job.calls}
        children: dict[str, list[str]] = {node: [] for node in calls}
        for c in job.calls:
            for parent in set(c.parents):
                children[parent].append(c.node_id)
        parents_left = {c.node_id: len(set(c.parents)) for c in job.calls}
        return cls(job, calls, children, parents_left, calls_left=len(calls))

    def footprint(self, node: str) -> float:
        call = self.calls[node]
        return call.prompt_tokens + (call.output_tokens + 1) / 2

    def demand(self) -> float:
        return sum(self.footprint(node) for node in self.running)


class _FluidRun:
    """One event-driven run of the fluid model; times are in steps."""

    def __init__(self, jobs: list[GpsJob], capacity: float, step_seconds: float) -> None:
        self.capacity = capacity
        self.step_seconds = step_seconds
        self.arrivals = sorted(jobs, key=lambda j: (j.arrival, j.job_id), reverse=True)
        self.active: dict[str, _JobRun] = {}
        self.starts: list[tuple[float, int, str, str]] = []  # (step, seq, job id, node) heap
        self.seq = 0
        self.rates: dict[tuple[str, str], float] = {}  # (job id, node) -> slot-steps per step
        self.finish: dict[str, float] = {}
        self.t = self.arrivals[-1].arrival / step_seconds if self.arrivals else 0.0

    def run(self) -> dict[str, float]:
        while self.arrivals or self.active:
            while self.arrivals and self.arrivals[-1].arrival / self.step_seconds <= self.t:
                self._admit(self.arrivals.pop())
            while self.starts and self.starts[0][0] <= self.t:
                _, _, job_id, node = heapq.heappop(self.starts)
                self._start(self.active[job_id], node)
            self._allocate()
            self._advance(self._next_event())
        return self.finish

    def _admit(self, job: GpsJob) -> None:
        run = self.active[job.job_id] = _JobRun.of(job)
        for node, count in run.parents_left.items():
            if count == 0:
                self._schedule(run, node)

    def _schedule(self, run: _JobRun, node: str) -> None:
        at = self.t + run.calls[node].delay / self.step_seconds
        if at <= self.t:
            self._start(run, node)
        else:
            heapq.heappush(self.starts, (at, self.seq, run.job.job_id, node))
            self.seq += 1

    def _start(self, run: _JobRun, node: str) -> None:
        call = run.calls[node]
        if call.output_tokens == 0:
            self._complete(run, node)
        else:
            run.running[node] = kv_token_time(call.prompt_tokens, call.output_tokens)

    def _complete(self, run: _JobRun, node: str) -> None:
        run.running.pop(node, None)
        run.calls_left -= 1
        if run.calls_left == 0:
            self.finish[run.job.job_id] = self.t
            del self.active[run.job.job_id]
            return
        for child in run.children[node]:
            run.parents_left[child] -= 1
            if run.parents_left[child] == 0:
                self._schedule(run, child)

    def _allocate(self) -> None:
        by_tenant: dict[str, list[_JobRun]] = {}
        for run in self.active.values():
            by_tenant.setdefault(run.job.tenant_id, []).append(run)
        tenants = list(by_tenant.values())
        demands = [[run.demand() for run in runs] for runs in tenants]
        tenant_shares = water_fill(
            self.capacity, [sum(d) for d in demands], [runs[0].job.weight for runs in tenants]
        )
        self.rates = {}
        for runs, job_demands, share in zip(tenants, demands, tenant_shares, strict=True):
            job_shares = water_fill(share, job_demands, [1.0] * len(runs))
            for run, demand, job_share in zip(runs, job_demands, job_shares, strict=True):
                for node in run.running:
                    self.rates[run.job.job_id, node] = run.footprint(node) * job_share / demand
        served = sum(self.rates.values())
        wanted = min(self.capacity, sum(map(sum, demands)))
        assert abs(served - wanted) <= 1e-9 * max(1.0, wanted)

    def _finish_step(self, run: _JobRun, node: str) -> float:
        rate = self.rates[run.job.job_id, node]
        return self.t + run.running[node] / rate if rate > 0 else math.inf

    def _next_event(self) -> float:
        candidates = [
            self._finish_step(run, node) for run in self.active.values() for node in run.running
        ]
        if self.arrivals:
            candidates.append(self.arrivals[-1].arrival / self.step_seconds)
        if self.starts:
            candidates.append(self.starts[0][0])
        assert candidates or not self.active, "active jobs but nothing can happen"
        return min(candidates, default=self.t)

    def _advance(self, until: float) -> None:
        """Serve every running call until `until`; those whose finish is due complete then."""
        due: list[tuple[_JobRun, str]] = []
        for run in self.active.values():
            for node in run.running:
                if self._finish_step(run, node) <= until:
                    due.append((run, node))
                else:
                    run.running[node] -= self.rates[run.job.job_id, node] * (until - self.t)
        self.t = until
        for run, node in due:
            self._complete(run, node)
