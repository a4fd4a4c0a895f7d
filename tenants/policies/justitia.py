"""Justitia (arXiv 2510.17015): serve jobs in the order of their ideal fair-share finish.

Each active job has a tag, its finish in virtual time under an idealised fair share of KV capacity
(tenants by weight, a tenant's jobs equally; see `fairshare.py`), keyed by its predicted remaining
KV token-time. A node's estimate is `kv_token_time(prompt, output)` with the output prediction
capped at max_tokens; the rendered prompt (and the prediction made for it) replaces the guess when
the call becomes ready, a prediction made again (while it waits, or once it is prefilled)
replaces that (never below what it has produced), and the truth replaces all when it finishes.
A call that runs past its
estimate is charged the excess at once, token by token, so its job's tag moves later while it runs
and a job predicted short is not favoured twice. The job with the earliest tag goes first with all
its ready calls, then the next (work-conserving). Shares: the jobs of a tenant ahead of its
share go after every other tenant's (chains, below, aside), as WF2Q serves only packets GPS has
started; ahead means that the real system has served and committed (the estimated rest of its
running calls) more than GPS has served it, by more than the virtual time the engine takes to
serve the backlog's largest call. Tags are finish times, and by them alone a backlogged tenant
of large weight with many jobs runs far ahead of its share, since a tenant's tags spread by its
job count over its weight (a saturated engine, weights 1:2:4, 32 jobs each: 0.655 of the service
to weight 4's 0.571). Knee: when the engine reports one and already
runs that many calls, only the first active jobs by tag, as many as the knee's calls (the
jobs that would make up the next batch were the knee's slots to turn over now), and the job with
the longest remaining critical path (defined below; the first to arrive on a tie) may still be
admitted, in tag order; both are chosen among all active jobs, so one that is thinking (no ready
call) admits nothing in its place. The longest job is the one predicted to end last whatever the
order: held back through a congestion it would run its whole path once the congestion clears,
nearly alone on the engine, and stretch the makespan; admitted, it costs one slot for a chain.
Chains: a job whose remaining critical path (the output estimates along its longest path of
unfinished calls, a running call counting its whole estimate; a token a step at best) exceeds
`CHAIN_FACTOR` times the steps the engine needs to drain every active job's estimated remaining
output at its current batch size (the engine's running calls, at least 1: on an idle or
single-call engine no job qualifies; where other gateway replicas share the engine, the backlog
of the jobs this policy holds over their own running calls, as it sees only those jobs), with
at least `MIN_CHAIN_CALLS` calls on a path left,
would end last whatever the order; held back by tag it only
stretches the end (the makespan, hence throughput). Such a job goes before the tag order, with
all its ready calls (a chain has one; a single long call qualifies too), below the knee; past
it the tag alone orders the admitted jobs (admitting every chain there cost the `cpu` regime more
JCT than it bought; the longest job alone is admitted, as above).
The engine's preemption priority stays the tag. A job that leaves is re-keyed to what it used
and stays in the fair share as a ghost until GPS would have finished it. Invariants: each active
job's cost in the clock is the sum of its node estimates; a job not marked stale has its
remaining path and total as its estimates give them now.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import NamedTuple

from tenants.policies.base import EngineLoad, ReadyCall, kv_token_time
from tenants.policies.bookkeeping import ActiveJob, BookPolicy, OrderKey, RunningCall
from tenants.policies.fairshare import FairShareClock

# A chain goes first when its remaining critical path exceeds this many drains of the backlog. A
# lower factor promotes jobs that are not the makespan's tail and costs bound violations (2 at
# gpu 0.9 with 1.0, against 1); 1.5 gives every gpu cell its tail back and keeps cpu 0.9's JCT
# within target 3 (docs/notes/scheduling.md, "The chain rule").
CHAIN_FACTOR = 1.5
# ... and when at least this many calls remain on that path. What makes a job end last whatever
# the order is a sequence of calls, each waiting its turn for room; a job with one or two calls
# on its path (a long single call, maps and their reduce) waits for at most two turns, so held
# back by tag it costs the makespan little, while promoted it goes before every smaller job
# (out of sample, task-parallel families: docs/notes/scheduling.md, "Out of sample").
MIN_CHAIN_CALLS = 3


class _Remaining(NamedTuple):
    """What is left of a job, from the estimates of its unfinished nodes."""

    path: float  # predicted output tokens along its longest path
    total: float  # predicted output tokens in all
    calls: int  # the most of them on one path
    largest_call: float  # the largest KV token-time of one of them


NOTHING_LEFT = _Remaining(0.0, 0.0, 0, 0.0)
# an unsent cost this small a share of its job's whole cost is what is left of float rounding
# once every node is sent: no offset
_UNSENT_ROUNDING = 1e-9


def _capped(predicted_output: float, max_tokens: int) -> float:
    """An output prediction as justitia charges it: never past the enforced max_tokens."""
    return min(predicted_output, float(max_tokens))


class JustitiaPolicy(BookPolicy):
    name = "justitia"
    by_weight = True

    def __init__(self, *, pampered_jobs: int | None = None) -> None:
        """`pampered_jobs`: the jobs still admitted past the knee by tag, besides the longest
        job; None (the default), as many as the knee's calls. Fewer leave the most urgent jobs'
        calls waiting behind the knee, more let it hold back nothing (justitia tends to its
        no-knee JCT). A count that follows the knee serves engines whose knees differ: on the
        scheduling study's `cpu` cells with step models whose knees are 13, 14 and 41 calls,
        its average JCT is within 1 % of the fixed count tuned on the 14-call knee (12), and 3
        to 6 % lower than that count's on a 4-call knee, where 12 jobs triple the batch
        (docs/notes/scheduling.md, "Pampering that follows the knee")."""
        if pampered_jobs is not None and pampered_jobs < 1:
            raise ValueError(f"pampered_jobs must be >= 1, got {pampered_jobs}")
        super().__init__()
        self._pampered_jobs = pampered_jobs
        self._clock = FairShareClock()
        self._estimates: dict[str, dict[str, tuple[int, float]]] = {}  # job -> node -> (p, d)
        # job -> the estimated KV token-time of its nodes neither done nor running, kept as
        # they change: `pool_offsets` is asked on every exchange with a shared pool's share
        self._unsent: dict[str, float] = {}
        # job -> what is left of it; a job in `_stale` is recomputed at the next peek, which
        # also fixes `_drain` and `_ahead`
        self._remaining: dict[str, _Remaining] = {}
        self._remaining_total = 0.0  # the sum of the totals in `_remaining`
        self._stale: set[str] = set()
        self._drain = math.inf  # steps to drain the backlog: set by `_eligible_jobs`, read by keys
        self._ahead: set[str] = set()  # tenants ahead of their share: set by `_eligible_jobs`

    def pampered_jobs(self, knee_calls: int) -> int:
        """How many jobs by tag are still admitted past a knee of `knee_calls`."""
        return knee_calls if self._pampered_jobs is None else self._pampered_jobs

    def tag(self, job_id: str) -> float:
        """The job's ideal finish in virtual time (comparable across all active jobs)."""
        return self._clock.tag(job_id)

    def pool_offsets(self, job_ids: Iterable[str], now: float) -> dict[str, float]:
        """Each job's predicted cost of its calls not yet dispatched, per unit of its tenant's
        weight: added to its tenant's service it is the job's fair-share finish were it its
        tenant's only job. A dispatched call is in its tenant's service already where the
        offsets are used (a pool shared by several gateways charges a call as it is granted).
        The share of its tenant's part among the tenant's other jobs is left out: they may sit
        on other gateways, so no gateway sees them all, while its own cost each one knows."""
        offsets: dict[str, float] = {}
        for job_id in job_ids:
            cost = self._unsent[job_id]
            if cost > _UNSENT_ROUNDING * self._clock.cost(job_id):
                offsets[job_id] = cost / self._jobs[job_id].info.weight
        return offsets

    def _measure_unsent(self, job_id: str) -> float:
        job = self._jobs[job_id]
        return sum(
            kv_token_time(p, d)
            for node_id, (p, d) in self._estimates[job_id].items()
            if _unsent_node(job, node_id)
        )

    def _rank(self, job: ActiveJob) -> tuple[float, float, str]:
        return (self._clock.tag(job.info.job_id), job.info.arrival, job.info.job_id)

    def _job_order(self, job: ActiveJob, now: float) -> OrderKey:
        return (not self._is_chain(job), job.info.tenant_id in self._ahead, *self._rank(job))

    def _standing(self, key: OrderKey) -> object:
        return key[0]  # a chain's precedence is its own (see `_job_order`)

    def _is_chain(self, job: ActiveJob) -> bool:
        left = self._remaining[job.info.job_id]
        return (
            self._drain < math.inf
            and left.path > CHAIN_FACTOR * self._drain
            and left.calls >= MIN_CHAIN_CALLS
        )

    def _path(self, job: ActiveJob) -> float:
        """The job's remaining critical path, as last measured."""
        return self._remaining[job.info.job_id].path

    def _job_priority(self, job: ActiveJob) -> float:
        return self._clock.tag(job.info.job_id)

    def _eligible_jobs(self, now: float, load: EngineLoad) -> Iterable[ActiveJob]:
        self._refresh_remaining()
        self._measure_shares()
        if load.knee_calls is None or load.running_calls < load.knee_calls:
            # its jobs' remaining output over the batch they hold: where other gateways' calls
            # share the engine, its own jobs are only part of the backlog and of the batch
            self._drain = self._remaining_total / max(load.calls_of_these_jobs, 1)
            return self._ready_jobs.values()
        self._drain = math.inf  # past the knee a slot is scarce: no chain goes before the tags
        pampered = self.pampered_jobs(load.knee_calls)
        admitted = heapq.nsmallest(pampered, self._jobs.values(), key=self._rank)
        longest = max(self._jobs.values(), key=self._path, default=None)
        if longest is not None and all(job is not longest for job in admitted):
            admitted.append(longest)
        return [job for job in admitted if job.ready]

    def _measure_shares(self) -> None:
        """Set `_ahead` for this peek's keys: the tenants with a ready call whose lead, with the
        estimated rest of their running calls counted as served, passes the virtual time the
        engine takes to serve the backlog's largest call. A lead of about one call is what
        serving short jobs first needs (a job waits a call's turn, as the bound `gps_finish + Δ`
        allows, Δ one longest call), while a lead of many lets a tenant's many short jobs take
        the service a backlogged tenant is owed. Running calls count because an engine with free
        slots takes many calls in one pass, before any of them is served."""
        largest = max((left.largest_call for left in self._remaining.values()), default=0.0)
        slack = self._clock.virtual_time(largest)
        committed: dict[str, float] = {}
        for job in self._jobs.values():
            estimates = self._estimates[job.info.job_id]
            for run in job.running.values():
                prompt, output = estimates[run.call.node_id]
                left = kv_token_time(prompt, output) - kv_token_time(prompt, run.output_tokens)
                tenant = job.info.tenant_id
                committed[tenant] = committed.get(tenant, 0.0) + max(0.0, left)
        tenants = {job.info.tenant_id for job in self._ready_jobs.values()}
        self._ahead = {t for t in tenants if self._clock.lead(t, committed.get(t, 0.0)) > slack}

    def _job_added(self, job: ActiveJob, now: float) -> None:
        estimates = {
            n.node_id: (n.prompt_tokens, _capped(n.predicted_output, n.max_tokens))
            for n in job.info.nodes
        }
        self._estimates[job.info.job_id] = estimates
        cost = sum(kv_token_time(p, d) for p, d in estimates.values())
        self._clock.add_job(job.info.job_id, job.info.tenant_id, job.info.weight, cost)
        self._unsent[job.info.job_id] = cost
        self._stale.add(job.info.job_id)

    def _call_ready(self, job: ActiveJob, call: ReadyCall, now: float) -> None:
        output = _capped(call.predicted_output, call.max_tokens)
        self._re_estimate(call.job_id, call.node_id, call.prompt_tokens, output)

    def _call_dispatched(self, job: ActiveJob, run: RunningCall, now: float) -> None:
        call = run.call
        self._unsent[call.job_id] -= kv_token_time(*self._estimates[call.job_id][call.node_id])

    def _call_requeued(self, job: ActiveJob, call: ReadyCall, now: float) -> None:
        self._unsent[call.job_id] += kv_token_time(*self._estimates[call.job_id][call.node_id])

    def _call_refined(self, job: ActiveJob, call: ReadyCall, produced: int, now: float) -> None:
        prompt, _ = self._estimates[call.job_id][call.node_id]
        output = _capped(call.predicted_output, call.max_tokens)
        self._re_estimate(call.job_id, call.node_id, prompt, max(output, produced))

    def _call_progressed(self, job: ActiveJob, run: RunningCall, previous: int, now: float) -> None:
        call = run.call
        prompt, output = self._estimates[call.job_id][call.node_id]
        if run.output_tokens > output:  # charged before the work it explains is served
            self._re_estimate(call.job_id, call.node_id, prompt, run.output_tokens)
        served = kv_token_time(call.prompt_tokens, run.output_tokens)
        self._clock.serve(call.job_id, served - kv_token_time(call.prompt_tokens, previous))

    def _call_finished(self, job: ActiveJob, run: RunningCall, prompt: int, now: float) -> None:
        self._re_estimate(run.call.job_id, run.call.node_id, prompt, run.output_tokens)
        self._stale.add(run.call.job_id)  # the node is done once the hook returns

    def _job_removed(self, job: ActiveJob, now: float) -> None:
        job_id = job.info.job_id
        used = {r.call.node_id: r.output_tokens for r in job.running.values()}
        # its unfinished nodes cost what they used: charged in one re-key of its tenant's jobs,
        # not one per node (a job of 256 nodes leaving re-keyed them 256 times)
        delta = sum(
            kv_token_time(prompt, used.get(node_id, 0)) - kv_token_time(prompt, output)
            for node_id, (prompt, output) in self._estimates.pop(job_id).items()
            if node_id not in job.done
        )
        del self._unsent[job_id]
        if delta:
            self._clock.charge(job_id, delta)
        self._clock.release(job_id)
        self._remaining_total -= self._remaining.pop(job_id, NOTHING_LEFT).total
        self._stale.discard(job_id)
        if not self._remaining:
            self._remaining_total = 0.0  # no float drift outlives a backlog

    def _re_estimate(self, job_id: str, node_id: str, prompt: int, output: float) -> None:
        estimates = self._estimates[job_id]
        delta = kv_token_time(prompt, output) - kv_token_time(*estimates[node_id])
        if _unsent_node(self._jobs[job_id], node_id):
            self._unsent[job_id] += delta
        if estimates[node_id] != (prompt, output):
            self._stale.add(job_id)
        estimates[node_id] = (prompt, output)
        if delta:
            self._clock.charge(job_id, delta)

    def _refresh_remaining(self) -> None:
        """Recompute `_remaining` for the stale jobs."""
        for job_id in self._stale:
            fresh = self._measure_remaining(job_id)
            self._remaining_total += fresh.total - self._remaining.get(job_id, NOTHING_LEFT).total
            self._remaining[job_id] = fresh
        self._stale.clear()

    def _measure_remaining(self, job_id: str) -> _Remaining:
        """What is left of the job, from the estimates of its unfinished nodes."""
        job, estimates = self._jobs[job_id], self._estimates[job_id]
        left = {n: d for n, (_, d) in estimates.items() if n not in job.done}
        calls = round(job.longest_path(dict.fromkeys(left, 1.0)))
        largest = max((kv_token_time(*estimates[n]) for n in left), default=0.0)
        return _Remaining(job.longest_path(left), sum(left.values()), calls, largest)

    def _check_order(self) -> None:
        self._clock.check_invariants()
        assert set(self._estimates) == set(self._jobs) == self._clock.live_jobs()
        assert set(self._remaining) | self._stale == set(self._jobs)
        total = sum(left.total for left in self._remaining.values())
        assert abs(total - self._remaining_total) <= 1e-6 * max(1.0, total)
        for job_id, cached in self._remaining.items():
            if job_id not in self._stale:
                assert cached == self._measure_remaining(job_id), f"{job_id}: stale path"
        for job_id, estimates in self._estimates.items():
            cost = sum(kv_token_time(p, d) for p, d in estimates.values())
            assert abs(cost - self._clock.cost(job_id)) <= 1e-6 * max(1.0, cost)
            unsent = self._measure_unsent(job_id)
            assert abs(unsent - self._unsent[job_id]) <= 1e-6 * max(1.0, cost), job_id


def _unsent_node(job: ActiveJob, node_id: str) -> bool:
    """Neither done nor running (ready, or not ready yet)."""
    return node_id not in job.done and job.started.get(node_id) not in job.running
