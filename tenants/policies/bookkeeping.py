"""Shared bookkeeping of every policy: the active jobs and their ready and running calls.

`BookPolicy` implements the `Policy` methods once. It checks each event against the book (the job
is active, a call is ready before it is dispatched and running before it reports tokens), records
it, and calls the hook the concrete policy overrides to keep its own accounting. `peek` returns the
first ready call (in readiness order) of the job with the smallest `_job_order` key among
`_eligible_jobs`, skipping held calls and held tenants (a call whose quota is being reserved, a
tenant a quota refused until a retry time: they stay ready, so nothing is re-added); among the
winner's tenant's eligible jobs of the winner's standing (`_standing`: a precedence the policy
grants one job, as justitia's chain rule or LAS's starvation guard, is that job's to spend: a job
of the tenant's that lacks it cannot take the turn, else the promoted job would never run and keep
winning its tenant every turn), the one with the highest job priority goes first (a tenant orders
its own jobs without changing its share). Invariant: every ready or running call belongs to an
active job and sits in exactly one of the two sets; a node of a job is ready, running or done at
most once; a job is in `_ready_jobs` exactly when it has a ready call; held calls are ready.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tenants.policies.base import EngineLoad, JobInfo, NodeCost, ReadyCall
from tenants.policies.dag import topological_order
from tenants.policies.errors import (
    CallNotFound,
    CallNotReady,
    CallNotRunning,
    DuplicateCall,
    DuplicateJob,
    InvalidCall,
    InvalidJob,
    InvalidProgress,
    JobNotFound,
)

OrderKey = tuple[float | str, ...]


@dataclass(slots=True)
class RunningCall:
    call: ReadyCall
    output_tokens: int = 0  # generated so far, as last reported


@dataclass(slots=True)
class ActiveJob:
    """A job in the book: what it arrived with and where each of its nodes stands."""

    info: JobInfo
    nodes: dict[str, NodeCost]
    topo_order: tuple[str, ...]  # parents before children
    ready: dict[str, ReadyCall] = field(default_factory=dict)  # call id -> call, readiness order
    running: dict[str, RunningCall] = field(default_factory=dict)
    started: dict[str, str] = field(default_factory=dict)  # node id -> its ready/running call id
    done: dict[str, tuple[int, int]] = field(default_factory=dict)  # node id -> (prompt, output)

    def longest_path(self, weight: Mapping[str, float]) -> float:
        """The heaviest path's weight through the DAG; nodes missing from `weight` weigh 0."""
        path: dict[str, float] = {}
        for node_id in self.topo_order:
            before = max((path[p] for p in self.nodes[node_id].parents), default=0.0)
            path[node_id] = before + weight.get(node_id, 0.0)
        return max(path.values(), default=0.0)


def validate_job_info(job: JobInfo) -> tuple[str, ...]:
    """Check a job's numbers and DAG; return its node ids parents-first."""
    if not (math.isfinite(job.weight) and job.weight > 0):
        raise InvalidJob(f"job {job.job_id}: weight must be finite and > 0, got {job.weight}")
    if not math.isfinite(job.arrival):
        raise InvalidJob(f"job {job.job_id}: arrival must be finite")
    if not job.nodes:
        raise InvalidJob(f"job {job.job_id}: no nodes")
    nodes = {n.node_id: n for n in job.nodes}
    if len(nodes) != len(job.nodes):
        raise InvalidJob(f"job {job.job_id}: duplicate node ids")
    for n in job.nodes:
        _validate_node(job.job_id, n)
    return topological_order(job.job_id, {nid: n.parents for nid, n in nodes.items()})


def _validate_node(job_id: str, node: NodeCost) -> None:
    numbers_ok = (
        node.prompt_tokens >= 0
        and node.max_tokens >= 0
        and math.isfinite(node.predicted_output)
        and node.predicted_output >= 0
        and (node.true_output is None or node.true_output >= 0)
    )
    if not numbers_ok:
        raise InvalidJob(f"job {job_id} node {node.node_id}: negative or non-finite numbers")


class BookPolicy:
    """Base of every policy: validated bookkeeping plus hooks; subclasses define the order."""

    name: str
    by_weight: bool  # each policy says (see Policy)

    def __init__(self) -> None:
        self._jobs: dict[str, ActiveJob] = {}
        self._call_job: dict[str, str] = {}  # ready or running call id -> job id
        self._ready_seq: dict[str, int] = {}  # ready call id -> readiness sequence number
        self._ready_at: dict[str, float] = {}  # ready call id -> when it became ready
        self._ready_jobs: dict[str, ActiveJob] = {}  # jobs with a ready call (an ordered set)
        self._next_seq = 0
        self._held: set[str] = set()  # ready calls not to show
        self._held_tenants: dict[str, float] = {}  # tenant -> held until (same clock as now)
        self._held_jobs: set[str] = set()  # active jobs whose ready calls are not to show
        self._prioritized = 0  # active jobs with a non-zero priority
        self._shedding = False  # sheddable jobs (negative priority) are held

    # --- the Policy interface ---------------------------------------------------------------

    def add_job(self, job: JobInfo, now: float) -> None:
        if job.job_id in self._jobs:
            raise DuplicateJob(f"job {job.job_id} is already active")
        order = validate_job_info(job)
        state = ActiveJob(job, {n.node_id: n for n in job.nodes}, order)
        self._job_added(state, now)
        self._jobs[job.job_id] = state
        self._prioritized += job.priority != 0

    def add_ready(self, call: ReadyCall, now: float) -> None:
        job = self._job(call.job_id)
        self._validate_ready(job, call)
        job.ready[call.call_id] = call
        job.started[call.node_id] = call.call_id
        self._call_job[call.call_id] = job.info.job_id
        self._ready_seq[call.call_id] = self._next_seq
        self._ready_at[call.call_id] = now
        self._next_seq += 1
        self._ready_jobs[job.info.job_id] = job
        self._call_ready(job, call, now)

    def peek(self, now: float, load: EngineLoad) -> ReadyCall | None:
        best: ActiveJob | None = None
        best_key: OrderKey | None = None
        holding = bool(self._held or self._held_tenants or self._held_jobs or self._shedding)
        by_standing: dict[tuple[str, object], tuple[tuple[int, OrderKey], ActiveJob]] = {}
        for job in self._eligible_jobs(now, load):
            key = self._job_order(job, now)
            # whether a job shows a call is asked only of one that would go first or take its
            # tenant's turn by priority: most jobs of a long backlog are neither
            beats = best_key is None or key < best_key
            if holding and (beats or self._prioritized) and self._first_shown(job, now) is None:
                continue
            if beats:
                best, best_key = job, key
            if self._prioritized:
                rank = (-job.info.priority, key)
                standing = (job.info.tenant_id, self._standing(key))
                if standing not in by_standing or rank < by_standing[standing][0]:
                    by_standing[standing] = (rank, job)
        if best is None or best_key is None:
            return None
        if self._prioritized:
            best = by_standing[(best.info.tenant_id, self._standing(best_key))][1]
        return self._first_shown(best, now) if holding else next(iter(best.ready.values()))

    def hold(self, call_id: str) -> None:
        job = self._jobs.get(self._call_job.get(call_id, ""))
        if job is None or call_id not in job.ready:
            raise CallNotReady(f"call {call_id} is not ready")
        self._held.add(call_id)

    def unhold(self, call_id: str) -> None:
        self._held.discard(call_id)

    def hold_tenant(self, tenant_id: str, until: float) -> None:
        self._held_tenants[tenant_id] = until

    def unhold_tenant(self, tenant_id: str) -> None:
        self._held_tenants.pop(tenant_id, None)

    def hold_job(self, job_id: str) -> None:
        self._job(job_id)
        self._held_jobs.add(job_id)

    def unhold_job(self, job_id: str) -> None:
        self._held_jobs.discard(job_id)

    def set_shedding(self, on: bool) -> None:
        self._shedding = on

    @property
    def shedding(self) -> bool:
        return self._shedding

    def mark_dispatched(self, call_id: str, now: float) -> None:
        job = self._jobs.get(self._call_job.get(call_id, ""))
        if job is None or call_id not in job.ready:
            raise CallNotReady(f"call {call_id} is not ready")
        self._held.discard(call_id)
        call = job.ready.pop(call_id)
        del self._ready_seq[call_id], self._ready_at[call_id]
        if not job.ready:
            del self._ready_jobs[job.info.job_id]
        run = RunningCall(call)
        job.running[call_id] = run
        self._call_dispatched(job, run, now)

    def on_progress(self, call_id: str, output_tokens: int, now: float) -> None:
        job, run = self._running(call_id)
        if output_tokens < run.output_tokens:
            raise InvalidProgress(
                f"call {call_id}: {output_tokens} output tokens after {run.output_tokens}"
            )
        if output_tokens > run.output_tokens:
            previous, run.output_tokens = run.output_tokens, output_tokens
            self._call_progressed(job, run, previous, now)

    def on_refined(self, call_id: str, predicted_output: float, now: float) -> None:
        """A call's output predicted again: a running call's once it was prefilled, a ready
        call's when its kind of call was found to mispredict."""
        job = self._owner(call_id)
        if not (math.isfinite(predicted_output) and predicted_output >= 0):
            raise InvalidProgress(f"call {call_id}: refined prediction {predicted_output}")
        run = job.running.get(call_id)
        if run is None:
            call = job.ready[call_id]
            call = job.ready[call_id] = dataclasses.replace(call, predicted_output=predicted_output)
            self._call_refined(job, call, 0, now)
        else:
            run.call = dataclasses.replace(run.call, predicted_output=predicted_output)
            self._call_refined(job, run.call, run.output_tokens, now)

    def on_finished(self, call_id: str, prompt_tokens: int, output_tokens: int, now: float) -> None:
        if prompt_tokens < 0:
            raise InvalidProgress(f"call {call_id}: negative prompt tokens")
        self.on_progress(call_id, output_tokens, now)
        job, run = self._running(call_id)
        self._call_finished(job, run, prompt_tokens, now)
        del job.running[call_id], self._call_job[call_id]
        del job.started[run.call.node_id]
        job.done[run.call.node_id] = (prompt_tokens, output_tokens)

    def requeue(self, call_id: str, now: float) -> None:
        """A running call was lost with its backend: it is ready again, to run once more. What
        its attempt was charged stays charged (the service was consumed); it keeps its place
        in counters that count ready and running calls alike, so no hook sees it arrive as a
        new call (`_call_requeued` sees it back)."""
        job, run = self._running(call_id)
        del job.running[call_id]
        call = run.call
        job.ready[call_id] = call
        self._ready_seq[call_id] = self._next_seq
        self._ready_at[call_id] = now
        self._next_seq += 1
        self._ready_jobs[job.info.job_id] = job
        self._call_requeued(job, call, now)

    def remove_job(self, job_id: str, now: float) -> None:
        job = self._job(job_id)
        self._job_removed(job, now)
        self._prioritized -= job.info.priority != 0
        for call_id in job.ready:
            del self._ready_seq[call_id], self._ready_at[call_id]
            self._held.discard(call_id)
        for call_id in (*job.ready, *job.running):
            del self._call_job[call_id]
        self._ready_jobs.pop(job_id, None)
        self._held_jobs.discard(job_id)
        del self._jobs[job_id]

    def priority(self, call_id: str) -> float:
        return self._job_priority(self._owner(call_id))

    def pool_offsets(self, job_ids: Iterable[str], now: float) -> dict[str, float]:
        return {}

    # --- hooks and order, for subclasses ----------------------------------------------------

    def _job_order(self, job: ActiveJob, now: float) -> OrderKey:
        raise NotImplementedError

    def _job_priority(self, job: ActiveJob) -> float:
        raise NotImplementedError

    def _standing(self, key: OrderKey) -> object:
        """The part of a job's order key that a job of the same tenant must share to take its
        turn by priority; none by default."""
        return None

    def _eligible_jobs(self, now: float, load: EngineLoad) -> Iterable[ActiveJob]:
        return self._ready_jobs.values()

    def _job_added(self, job: ActiveJob, now: float) -> None:
        """Called before the job enters the book."""

    def _call_ready(self, job: ActiveJob, call: ReadyCall, now: float) -> None:
        """Called after the call entered `job.ready`."""

    def _call_dispatched(self, job: ActiveJob, run: RunningCall, now: float) -> None:
        """Called after the call moved to `job.running`."""

    def _call_progressed(self, job: ActiveJob, run: RunningCall, previous: int, now: float) -> None:
        """Called after `run.output_tokens` grew from `previous`."""

    def _call_requeued(self, job: ActiveJob, call: ReadyCall, now: float) -> None:
        """Called after a lost call moved back to `job.ready`."""

    def _call_refined(self, job: ActiveJob, call: ReadyCall, produced: int, now: float) -> None:
        """Called after the ready or running call took its new prediction; `produced`: the
        output tokens it has reported so far (0 while ready)."""

    def _call_finished(self, job: ActiveJob, run: RunningCall, prompt: int, now: float) -> None:
        """Called while the call is still running, its final tokens already reported."""

    def _job_removed(self, job: ActiveJob, now: float) -> None:
        """Called while the job and its calls are still in the book."""

    # --- helpers ----------------------------------------------------------------------------

    def _first_shown(self, job: ActiveJob, now: float) -> ReadyCall | None:
        """The job's first ready call that is not held, or None."""
        if (self._shedding and job.info.priority < 0) or job.info.job_id in self._held_jobs:
            return None
        until = self._held_tenants.get(job.info.tenant_id)
        if until is not None:
            if until > now:
                return None
            del self._held_tenants[job.info.tenant_id]
        return next((c for c in job.ready.values() if c.call_id not in self._held), None)

    def _job(self, job_id: str) -> ActiveJob:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(f"job {job_id} is not active")
        return job

    def _owner(self, call_id: str) -> ActiveJob:
        job_id = self._call_job.get(call_id)
        if job_id is None:
            raise CallNotFound(f"call {call_id} is neither ready nor running")
        return self._jobs[job_id]

    def _running(self, call_id: str) -> tuple[ActiveJob, RunningCall]:
        job = self._jobs.get(self._call_job.get(call_id, ""))
        if job is None or call_id not in job.running:
            raise CallNotRunning(f"call {call_id} is not running")
        return job, job.running[call_id]

    def _validate_ready(self, job: ActiveJob, call: ReadyCall) -> None:
        if call.call_id in self._call_job:
            raise DuplicateCall(f"call {call.call_id} is already ready or running")
        if call.tenant_id != job.info.tenant_id:
            raise InvalidCall(f"call {call.call_id}: tenant differs from its job's")
        if call.node_id not in job.nodes:
            raise InvalidCall(f"call {call.call_id}: job {job.info.job_id} has no such node")
        if call.node_id in job.started or call.node_id in job.done:
            raise InvalidCall(f"call {call.call_id}: node {call.node_id} already ran")
        if call.prompt_tokens < 0 or call.max_tokens < 0 or not call.predicted_output >= 0:
            raise InvalidCall(f"call {call.call_id}: negative or non-finite numbers")

    def check_invariants(self) -> None:
        """Assert the book's invariants (for tests and debugging)."""
        seen: set[str] = set()
        for job_id, job in self._jobs.items():
            calls = {*job.ready, *job.running}
            assert not calls & seen and len(calls) == len(job.ready) + len(job.running)
            seen |= calls
            assert all(self._call_job[c] == job_id for c in calls)
            assert (job_id in self._ready_jobs) == bool(job.ready)
            nodes = [c.node_id for c in job.ready.values()]
            nodes += [r.call.node_id for r in job.running.values()]
            assert sorted(nodes) == sorted(job.started) and not set(nodes) & set(job.done)
        assert seen == set(self._call_job)
        ready = {c for job in self._jobs.values() for c in job.ready}
        assert ready == set(self._ready_seq) == set(self._ready_at)
        assert self._held <= ready and self._held_jobs <= self._jobs.keys()
        assert self._prioritized == sum(j.info.priority != 0 for j in self._jobs.values())
        self._check_order()

    def _check_order(self) -> None:
        """Subclasses assert their own invariants here."""
