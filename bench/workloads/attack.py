"""The adversarial tenant: calls that look ordinary, are predicted short, and run to max_tokens.

Its jobs are single calls with the workload's median prompt, claiming the workload's median
output length, that really generate `max_tokens` (the room the context leaves, at most its cap).
Their count is `ATTACKER_SHARE` of the workload's jobs (about the smallest ServeGen light
tenant's share), arriving as a Poisson stream over the workload's arrival window. Invariant: the
honest jobs are untouched; the attacker's ids and tenant name are new.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.workloads.format import Job, Node
from bench.workloads.lengths import max_tokens_cap

ATTACKER = "attacker"
ATTACKER_SHARE = 0.08


def attacker_jobs(
    jobs: Sequence[Job], context: int, seed: int
) -> tuple[list[Job], dict[tuple[str, str], float]]:
    """The attacker's jobs and the short lengths they claim, `(job id, node id) -> tokens`."""
    calls = [n for j in jobs for n in j.nodes]
    prompt = int(np.median([n.prompt_tokens for n in calls]))
    claimed = float(np.median([n.output_tokens for n in calls]))
    max_tokens = min(max_tokens_cap(context), context - prompt)
    start = min(j.arrival for j in jobs)
    window = max(j.arrival for j in jobs) - start
    count = max(1, round(ATTACKER_SHARE * len(jobs)))
    rng = np.random.default_rng([seed, 7919])
    times = np.sort(rng.uniform(start, start + window, size=count))
    out = [
        Job(
            f"{ATTACKER}-{k:05d}",
            ATTACKER,
            1.0,
            float(t),
            "attack",
            (Node("call", (), prompt, max_tokens, max_tokens),),
        )
        for k, t in enumerate(times)
    ]
    return out, {(j.job_id, "call"): claimed for j in out}
