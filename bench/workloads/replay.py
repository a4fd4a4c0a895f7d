"""A hook for the live check: workload jobs as gateway job specs.

Each node becomes a prompt of about `prompt_tokens * scale` words (a short common word is about
one token), with `max_tokens = ceil(output_tokens * scale)` and its parents as `depends_on`; the
job's kind names its calls (for length history). The words are drawn from a fixed list of short
English words, many of them function words, by a generator seeded with the job and node ids:
prompts differ from call to call (no shared prefixes) and read as prose to the anomaly guard, so
filler is neither repetitive nor word salad to it. Think delays and arrival times are not part of
a JobSpec: the replaying client waits `arrival` before submitting and cannot reproduce `think_s`.
Invariant: the spec's DAG is the job's, and the same job gives the same spec.
"""

from __future__ import annotations

import math
import random

from bench.workloads.format import Job
from gateway.jobs.model import JobSpec, NodeSpec, SamplingSpec

_PROSE = (
    "the of to and a in is it that for on with as at by from this be or are we can all one "
    "time day work plan code data note list step file test run user task page line word "
    "text read make find keep show call send fix move add check write open view sort"
)
WORDS = tuple(_PROSE.split())  # short English words, many of them function words


def filler(words: int, key: str) -> str:
    """`words` short words, the same for the same key."""
    rng = random.Random(key)
    return " ".join(rng.choice(WORDS) for _ in range(max(1, words)))


def to_job_spec(job: Job, scale: float = 1.0) -> JobSpec:
    """The job as a gateway JobSpec, its token counts multiplied by `scale` (at least 1)."""
    nodes = tuple(
        NodeSpec(
            id=node.node_id,
            prompt_template=filler(
                round(node.prompt_tokens * scale), f"{job.job_id}/{node.node_id}"
            ),
            depends_on=node.parents,
            sampling=SamplingSpec(
                max_tokens=max(1, math.ceil(round(node.output_tokens * scale, 9)))
            ),
            name=job.kind,
        )
        for node in job.nodes
    )
    return JobSpec(nodes=nodes, name=job.job_id)
