"""What the policies are told about each call's output length.

`oracle`: the true length. `noisy`: the true length times `exp(N(0, sigma))`, one draw per
call from a generator seeded by `seed` (jobs in id order, nodes in file order), so every policy
sees the same errors. `lying`: the tenant's calls claim `claimed[(job, node)]` (short), the
others are told the truth. The simulation asks a `CallPredictor`: a job's nodes when it arrives,
each call again when it becomes ready (and a ready call again when the predictor says so), and
it hears each true length; `FixedPredictions` serves
one of these mappings, the same at both times, learning nothing (a predictor that learns, with
the gateway's conservative mode: `bench.sim.conservative`). Invariant: every (job, node) of the
workload has a prediction > 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bench.workloads.format import Job, Node

Predictions = dict[tuple[str, str], float]


@dataclass(frozen=True, slots=True)
class CallEstimate:
    """A ready call's prediction as the gateway's planner hands it on."""

    policy_output: float  # the output the policy orders the call by
    reserve_output: int  # the output KV the engine sets aside for it


class CallPredictor(Protocol):
    """What the simulation is told of each call's output length, and tells back."""

    def estimate(self, job: Job, node: Node) -> float:
        """The node's predicted output when its job arrives (the policy's `NodeCost`)."""
        ...

    def plan(self, job: Job, node: Node, now: float) -> CallEstimate:
        """The call's prediction when it becomes ready."""
        ...

    def progressed(self, job: Job, node: Node, produced: int, now: float) -> bool:
        """The running call has produced `produced` output tokens so far. True when its tenant's
        ready calls are to be planned again (`replan`)."""
        ...

    def observe(self, job: Job, node: Node, produced: int, now: float) -> bool:
        """The call finished with `produced` output tokens. True as for `progressed`."""
        ...

    def replan(self, job: Job, node: Node, now: float) -> CallEstimate | None:
        """The ready call's prediction planned again, or None when it stands."""
        ...


class FixedPredictions:
    """A fixed `(job id, node id) -> output` mapping: the same at arrival and when ready; the
    engine reserves the prediction, capped at max_tokens; learns nothing."""

    def __init__(self, predictions: Mapping[tuple[str, str], float]) -> None:
        self.predictions = predictions

    def estimate(self, job: Job, node: Node) -> float:
        return self.predictions[job.job_id, node.node_id]

    def plan(self, job: Job, node: Node, now: float) -> CallEstimate:
        predicted = self.predictions[job.job_id, node.node_id]
        return CallEstimate(predicted, math.ceil(min(predicted, node.max_tokens)))

    def progressed(self, job: Job, node: Node, produced: int, now: float) -> bool:
        return False

    def observe(self, job: Job, node: Node, produced: int, now: float) -> bool:
        return False

    def replan(self, job: Job, node: Node, now: float) -> CallEstimate | None:
        return None


def oracle(jobs: Sequence[Job]) -> Predictions:
    return {(j.job_id, n.node_id): float(n.output_tokens) for j in jobs for n in j.nodes}


def noisy(jobs: Sequence[Job], sigma: float, seed: int) -> Predictions:
    rng = np.random.default_rng(seed)
    out: Predictions = {}
    for job in sorted(jobs, key=lambda j: j.job_id):
        factors = np.exp(rng.normal(0.0, sigma, size=len(job.nodes)))
        for node, factor in zip(job.nodes, factors, strict=True):
            out[job.job_id, node.node_id] = float(node.output_tokens * factor)
    return out


def lying(jobs: Sequence[Job], claimed: Mapping[tuple[str, str], float]) -> Predictions:
    out = oracle(jobs)
    out.update(claimed)
    return out
