"""Weighted fairness on a saturated engine: each tenant's share of service against its weight's.

The workload's arrivals are rescaled to `load` (default 3: each of three equal tenants alone
offers about the whole engine), so every tenant stays backlogged while jobs keep arriving, and
the busy period measured is the arrival window less its first `WARMUP` (while the first backlog
builds). Each tenant's share of the KV token-time served in that period is compared with its
weight's share of the weights; the error is the largest `|share / weight share - 1|` (issue 20,
point 5: at most 0.1). A burst of every job at once would not do: an order by fair-share finish
serves a tenant's small jobs first whatever their weight, so shares between two instants of a
burst reflect job sizes as much as weights; a sustained stream averages them out. Also reported,
over the whole run: each tenant's mean slowdown (JCT over its GPS JCT) and Jain's index of
those. Invariant: a pure function of the workload, the regime, the load and the policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.sim.metrics import run_metrics
from bench.sim.predictions import oracle
from bench.sim.regime import Regime
from bench.sim.setup import prepare
from bench.sim.simulator import Simulation
from bench.sim.study import yardstick
from bench.workloads.format import Job
from bench.workloads.load import at_load
from tenants.policies import make_policy

SATURATING_LOAD = 3.0
WARMUP = 0.1  # of the arrival window, left out of the measured period
SNAPSHOTS = 1000  # service snapshots over the arrival window


@dataclass(frozen=True, slots=True)
class WeightedShares:
    policy: str
    period_s: tuple[float, float]  # the measured busy period
    share: dict[str, float]  # tenant -> its share of the service in the period
    weight_share: dict[str, float]  # tenant -> its weight over the sum of the weights
    error: float  # max over tenants of |share / weight share - 1|
    mean_slowdown: dict[str, float]
    jain_slowdown: float


def _served_at(service: list[tuple[float, dict[str, float]]], t: float) -> dict[str, float]:
    """Cumulative service per tenant at the last snapshot at or before `t`."""
    before = [s for when, s in service if when <= t]
    return before[-1] if before else {}


def saturated_shares(
    jobs: Sequence[Job], regime: Regime, policy: str, load: float = SATURATING_LOAD
) -> WeightedShares:
    prepared = prepare(jobs, regime)
    stream = at_load(jobs, load, prepared.capacity, prepared.step_seconds)
    first, last = stream[0].arrival, stream[-1].arrival
    record_s = (last - first) / SNAPSHOTS
    sim = Simulation(stream, make_policy(policy), prepared.setup, oracle(stream), record_s)
    result = sim.run()
    start, end = first + WARMUP * (last - first), last
    before, after = _served_at(result.service, start), _served_at(result.service, end)
    weights = {j.tenant: j.weight for j in stream}
    served = {t: after.get(t, 0.0) - before.get(t, 0.0) for t in sorted(weights)}
    share = {t: s / sum(served.values()) for t, s in served.items()}
    weight_share = {t: w / sum(weights.values()) for t, w in sorted(weights.items())}
    error = max(abs(share[t] / weight_share[t] - 1.0) for t in share)
    stick = yardstick(stream, prepared)
    metrics = run_metrics(stream, result, stick.gps, stick.delta, stick.solo, stick.solo_think)
    return WeightedShares(
        policy,
        (start, end),
        share,
        weight_share,
        error,
        metrics.mean_slowdown,
        metrics.jain_slowdown,
    )
