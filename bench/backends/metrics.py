"""One arm's run judged as the scheduling study judges a policy's, and the rounds' medians.

A run's jobs become a `bench.sim.SimResult` (finish = arrival + the JCT its client saw, the
output tokens every call generated) and go through the study's own `run_metrics` with the GPS
finish times of the same jobs (`bench.sim.reference.gps_finish` at the measured capacity), the
bound's slack Δ (the largest call's time alone on the idle server, measured) and each job's JCT
alone (measured): average and p99 JCT, average queueing (JCT less the job's JCT alone),
throughput (output tokens from the first arrival to the last finish), bound violations
(`finish > gps_finish + Δ`), the worst tenant slowdown (JCT over GPS JCT) and Jain's index over
the tenants' mean slowdowns. The figure of an arm is the median over its rounds. A lone call's
added TTFT is fairgate's TTFT less its server's part of it (`ttft_report`). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bench.backends.records import ArmRun, LoneCall
from bench.sim.metrics import RunMetrics, run_metrics
from bench.sim.simulator import SimResult
from bench.workloads.format import Job

# the figures of the JSON report, each a RunMetrics field or a function of one
FIGURES = ("avg_jct", "avg_queueing", "p99_jct", "throughput", "bound_violations")


@dataclass(frozen=True, slots=True)
class Reference:
    """What a run is judged against, measured once per backend."""

    gps: dict[str, float]  # job id -> GPS finish (seconds after the start)
    delta_s: float  # the bound's slack: the largest call alone
    alone: dict[str, float]  # job id -> its JCT alone on the idle server


def arm_metrics(jobs: Sequence[Job], run: ArmRun, reference: Reference) -> RunMetrics:
    """`jobs` as they ran (`workload.as_run`): their arrivals and output tokens."""
    finish = {j.job_id: j.arrival + run.jobs[j.job_id].jct for j in jobs}
    output = sum(n.output_tokens for j in jobs for n in j.nodes)
    span = max(finish.values()) - min(j.arrival for j in jobs)
    result = SimResult(run.arm, finish, output_tokens=output, busy_s=span)
    no_think = {j.job_id: 0.0 for j in jobs}
    return run_metrics(jobs, result, reference.gps, reference.delta_s, reference.alone, no_think)


def worst_slowdown(metrics: RunMetrics) -> float:
    return max(metrics.worst_slowdown.values())


def figures(metrics: RunMetrics) -> dict[str, float]:
    out = {name: float(getattr(metrics, name)) for name in FIGURES}
    out["worst_slowdown"] = worst_slowdown(metrics)
    out["jain"] = metrics.jain_slowdown
    return out


def medians(runs: Mapping[str, Sequence[RunMetrics]]) -> dict[str, dict[str, float]]:
    """Figure -> arm -> the median over the arm's rounds."""
    per_arm = {arm: [figures(m) for m in ms] for arm, ms in runs.items()}
    names = next(iter(per_arm.values()))[0].keys()
    return {
        name: {arm: float(np.median([f[name] for f in fs])) for arm, fs in per_arm.items()}
        for name in names
    }


def percentiles_ms(seconds: Sequence[float]) -> dict[str, float]:
    values = np.asarray(seconds) * 1e3
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


def ttft_report(calls: Sequence[LoneCall]) -> dict[str, dict[str, float]]:
    """Lone calls' TTFT percentiles: direct; added by fairgate (its client's TTFT less its
    server's part of it, the same request's); and the paired difference (fairgate's TTFT less
    the direct send's of the same prompt), which also carries how the server's own TTFT varies
    from one send of a prompt to the next."""
    return {
        "added_ttft_ms": percentiles_ms([c.fairgate - c.server for c in calls]),
        "paired_added_ttft_ms": percentiles_ms([c.fairgate - c.direct for c in calls]),
        "direct_ttft_ms": percentiles_ms([c.direct for c in calls]),
    }
