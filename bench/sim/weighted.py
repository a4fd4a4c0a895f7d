"""Weighted fairness on a saturated engine: each tenant's share of service against its weight's.

Saturation by a closed loop: each tenant runs `clients` clients, each sending the tenant's jobs
one after another (its next job the moment its last one finishes; the tenant's jobs dealt to its
clients in arrival order, every client's first job at time 0). With enough clients each tenant
alone would fill the engine, so every tenant stays backlogged while at least half its clients
still send; the first instant a tenant has fewer ends the busy period measured, and its first
`WARMUP` is left out (while the first batch settles). Each tenant's share of the KV token-time
served in the period is compared with its weight's share of the weights; the error is the largest
`|share / weight share - 1|` (issue 20, point 5: at most 0.1). An open stream past capacity
would not do: a tenant's backlog grows without end there, and an order by fair-share finish
under processor sharing within a tenant then finishes ever fewer of its jobs per unit of the
service it is owed. Also reported, over the whole run: each tenant's mean slowdown (JCT over
its GPS JCT, on the arrivals the loop produced) and Jain's index of those. Invariant: a pure
function of the workload, the regime, the policy and the number of clients.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from bench.sim.metrics import run_metrics
from bench.sim.predictions import oracle
from bench.sim.regime import Regime
from bench.sim.setup import prepare
from bench.sim.simulator import Simulation
from bench.sim.study import yardstick
from bench.workloads.format import Job
from tenants.policies import make_policy

CLIENTS = 32  # per tenant: each tenant alone keeps about twice the gpu engine's calls waiting
WARMUP = 0.1  # of the busy period, left out of the measure
SNAPSHOT_STEPS = 10  # engine steps between service snapshots, at the probed step length


@dataclass(frozen=True, slots=True)
class WeightedShares:
    policy: str
    period_s: tuple[float, float]  # the measured busy period
    share: dict[str, float]  # tenant -> its share of the service in the period
    weight_share: dict[str, float]  # tenant -> its weight over the sum of the weights
    error: float  # max over tenants of |share / weight share - 1|
    mean_slowdown: dict[str, float]
    jain_slowdown: float


def closed_loop(jobs: Sequence[Job], clients: int) -> tuple[list[Job], dict[str, Job]]:
    """The clients' first jobs (at time 0) and, per job, the job its client sends next."""
    by_tenant: dict[str, list[Job]] = defaultdict(list)
    for job in sorted(jobs, key=lambda j: (j.arrival, j.job_id)):
        by_tenant[job.tenant].append(job)
    first: list[Job] = []
    followers: dict[str, Job] = {}
    for tenant_jobs in by_tenant.values():
        for c in range(min(clients, len(tenant_jobs))):
            chain = tenant_jobs[c::clients]
            first.append(chain[0].at(0.0))
            followers.update({a.job_id: b for a, b in pairwise(chain)})
    return first, followers


def _busy_until(
    jobs: Sequence[Job], followers: dict[str, Job], finish: dict[str, float], clients: int
) -> float:
    """When the first tenant is left with fewer than half its clients sending: each client
    stops when its last job ends."""
    stops: dict[str, list[float]] = defaultdict(list)
    for job in jobs:
        if job.job_id not in followers:  # a client's last job
            stops[job.tenant].append(finish[job.job_id])
    half = (clients + 1) // 2
    return min(sorted(times)[min(half, len(times)) - 1] for times in stops.values())


def _served_at(service: list[tuple[float, dict[str, float]]], t: float) -> dict[str, float]:
    """Cumulative service per tenant at the last snapshot at or before `t`."""
    before = [s for when, s in service if when <= t]
    return before[-1] if before else {}


def saturated_shares(
    jobs: Sequence[Job], regime: Regime, policy: str, clients: int = CLIENTS
) -> WeightedShares:
    prepared = prepare(jobs, regime)
    first, followers = closed_loop(jobs, clients)
    record_s = SNAPSHOT_STEPS * prepared.step_seconds
    sim = Simulation(
        first, make_policy(policy), prepared.setup, oracle(jobs), record_s, followers=followers
    )
    result = sim.run()
    end = _busy_until(jobs, followers, result.finish, clients)
    start = WARMUP * end
    before, after = _served_at(result.service, start), _served_at(result.service, end)
    weights = {j.tenant: j.weight for j in jobs}
    served = {t: after.get(t, 0.0) - before.get(t, 0.0) for t in sorted(weights)}
    share = {t: s / sum(served.values()) for t, s in served.items()}
    weight_share = {t: w / sum(weights.values()) for t, w in sorted(weights.items())}
    error = max(abs(share[t] / weight_share[t] - 1.0) for t in share)
    arrived = [j.at(result.arrived.get(j.job_id, 0.0)) for j in jobs]
    stick = yardstick(arrived, prepared)
    metrics = run_metrics(arrived, result, stick.gps, stick.delta, stick.solo, stick.solo_think)
    return WeightedShares(
        policy,
        (start, end),
        share,
        weight_share,
        error,
        metrics.mean_slowdown,
        metrics.jain_slowdown,
    )
