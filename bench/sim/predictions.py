"""What the policies are told about each call's output length.

`oracle`: the true length. `noisy`: the true length times `exp(N(0, sigma))`, one draw per
call from a generator seeded by `seed` (jobs in id order, nodes in file order), so every policy
sees the same errors. `lying`: the tenant's calls claim `claimed[(job, node)]` (short), the
others are told the truth. Invariant: every (job, node) of the workload has a prediction > 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from bench.workloads.format import Job

Predictions = dict[tuple[str, str], float]


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
