"""A hook for the live check: workload jobs as gateway job specs.

Each node becomes a prompt of about `prompt_tokens * scale` tokens of filler words (one short
word is about one token), with `max_tokens = ceil(output_tokens * scale)` and its parents as
`depends_on`; the job's kind names its calls (for length history). Think delays and arrival
times are not part of a JobSpec: the replaying client waits `arrival` before submitting and
cannot reproduce `think_s`. Invariant: the spec's DAG is the job's.
"""

from __future__ import annotations

import math

from bench.workloads.format import Job
from gateway.jobs.model import JobSpec, NodeSpec, SamplingSpec

FILLER = "go "


def to_job_spec(job: Job, scale: float = 1.0) -> JobSpec:
    """The job as a gateway JobSpec, its token counts multiplied by `scale` (at least 1)."""
    nodes = tuple(
        NodeSpec(
            id=node.node_id,
            prompt_template=FILLER * max(1, round(node.prompt_tokens * scale)),
            depends_on=node.parents,
            sampling=SamplingSpec(
                max_tokens=max(1, math.ceil(round(node.output_tokens * scale, 9)))
            ),
            name=job.kind,
        )
        for node in job.nodes
    )
    return JobSpec(nodes=nodes, name=job.job_id)
