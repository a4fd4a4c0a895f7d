"""Metrics of one policy's run on one workload: speed and fairness.

JCT = finish - arrival. Throughput = output tokens / (last finish - first arrival); busy
throughput = output tokens / time spent in engine steps (batch efficiency). A job breaks
the fairness bound when `finish > gps_finish + Δ`. A job's slowdown is its JCT over its GPS JCT
(`gps_finish - arrival`); per tenant the study reports the worst slowdown and the mean, and
Jain's index over the tenants' mean slowdowns, `(Σx)^2 / (n Σx^2)` (1: every tenant slowed
alike). Where the JCT goes: JCT = solo JCT (the job alone on the empty engine, `solo_timeline`,
a floor no order can beat) + queueing delay (the part an order can change); of the solo JCT,
the think part is what the job's think delays add to it (solo JCT less the solo JCT with think
delays removed). Invariant: pure functions of the run, the workload and the GPS reference.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench.sim.simulator import SimResult
from bench.workloads.format import Job


@dataclass(frozen=True, slots=True)
class RunMetrics:
    avg_jct: float
    p99_jct: float
    throughput: float  # output tokens per second, first arrival to last finish
    busy_throughput: float  # output tokens per second the engine spent stepping
    bound_violations: int
    violations_by_tenant: dict[str, int]
    worst_slowdown: dict[str, float]  # tenant -> max JCT / GPS JCT
    mean_slowdown: dict[str, float]  # tenant -> mean JCT / GPS JCT
    jain_slowdown: float
    avg_solo_jct: float  # mean JCT alone on the empty engine: the zero-queueing floor
    avg_solo_think: float  # mean part of the solo JCT due to think delays
    avg_queueing: float  # mean JCT - solo JCT
    preemptions: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def jain_index(values: Sequence[float]) -> float:
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0 or not np.any(x):
        return 1.0
    return float(x.sum() ** 2 / (len(x) * (x**2).sum()))


def run_metrics(
    jobs: Sequence[Job],
    result: SimResult,
    gps: Mapping[str, float],
    delta: float,
    solo_jct: Mapping[str, float],
    solo_think: Mapping[str, float],
) -> RunMetrics:
    jct = np.asarray([result.finish[j.job_id] - j.arrival for j in jobs])
    start = min(j.arrival for j in jobs)
    span = max(result.finish.values()) - start
    slowdowns: dict[str, list[float]] = defaultdict(list)
    violations: dict[str, int] = defaultdict(int)
    for job, time in zip(jobs, jct, strict=True):
        ideal = max(gps[job.job_id] - job.arrival, 1e-9)
        slowdowns[job.tenant].append(float(time) / ideal)
        violations[job.tenant] += result.finish[job.job_id] > gps[job.job_id] + delta
    means = {t: float(np.mean(v)) for t, v in sorted(slowdowns.items())}
    queueing = [float(t) - solo_jct[j.job_id] for j, t in zip(jobs, jct, strict=True)]
    return RunMetrics(
        avg_jct=float(jct.mean()),
        p99_jct=float(np.percentile(jct, 99)),
        throughput=result.output_tokens / span if span > 0 else 0.0,
        busy_throughput=result.output_tokens / result.busy_s if result.busy_s > 0 else 0.0,
        bound_violations=sum(violations.values()),
        violations_by_tenant={t: violations[t] for t in sorted(slowdowns)},
        worst_slowdown={t: float(max(v)) for t, v in sorted(slowdowns.items())},
        mean_slowdown=means,
        jain_slowdown=jain_index(list(means.values())),
        avg_solo_jct=float(np.mean([solo_jct[j.job_id] for j in jobs])),
        avg_solo_think=float(np.mean([solo_think[j.job_id] for j in jobs])),
        avg_queueing=float(np.mean(queueing)),
        preemptions=result.preemptions,
    )


def subset_avg_jct(jobs: Sequence[Job], result: SimResult, tenants: set[str]) -> float:
    """Mean JCT of the jobs of the given tenants."""
    jct = [result.finish[j.job_id] - j.arrival for j in jobs if j.tenant in tenants]
    return float(np.mean(jct))
