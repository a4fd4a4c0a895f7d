"""A backend's measurements as the report's figures, the issue's targets checked, and a table.

`backend_report` gives the keys of the machine-readable output (the medians over rounds of each
arm's figures, the jobs, the lone calls' TTFTs); `backend_details` what backs them (each round's
figures, violations by tenant, each job's JCT, the capacity, Δ, calls off plan, wall times, and
each job's tenant, arrival, GPS finish and JCT alone); `targets` the four
targets of issue 15 point 4, judged on the medians. The heavy tenant is the workload's first
profile (`bench.workloads.arrivals.TENANT_PROFILES`); the others are the light tenants. Pure.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from bench.backends.config import ARMS, DIRECT
from bench.backends.measure import Measured
from bench.backends.metrics import arm_metrics, figures, medians, percentiles_ms, ttft_report
from bench.backends.workload import Workload, as_run
from bench.sim.metrics import RunMetrics
from bench.workloads.arrivals import TENANT_PROFILES

HEAVY_TENANT = TENANT_PROFILES[0][0]
JUSTITIA = "fairgate-justitia"


def _metrics(measured: Measured, workload: Workload) -> dict[str, list[RunMetrics]]:
    jobs = as_run(workload.jobs)
    return {
        arm: [arm_metrics(jobs, run, measured.reference) for run in measured.runs[arm]]
        for arm in ARMS
        if arm in measured.runs
    }


def light_violations(metrics: RunMetrics) -> int:
    return sum(n for t, n in metrics.violations_by_tenant.items() if t != HEAVY_TENANT)


def backend_report(measured: Measured, workload: Workload, name: str) -> dict[str, Any]:
    per_arm = _metrics(measured, workload)
    figures_ = medians(per_arm)
    return {
        "backend": name,
        "avg_jct": figures_["avg_jct"],
        "avg_queueing": figures_["avg_queueing"],
        "p99_jct": figures_["p99_jct"],
        "throughput": figures_["throughput"],
        "bound_violations": figures_["bound_violations"],
        "jobs": len(workload.jobs),
        "worst_slowdown": figures_["worst_slowdown"],
        "jain": figures_["jain"],
        **ttft_report(measured.ttft),
    }


def backend_details(measured: Measured, workload: Workload) -> dict[str, Any]:
    per_arm = _metrics(measured, workload)
    fairgate_ttft = [c.fairgate for c in measured.ttft]
    reference = measured.reference
    return {
        "capacity": {**asdict(measured.capacity), "work_per_s": measured.capacity.work_per_s},
        "delta_s": reference.delta_s,
        # what a job's JCT in a round is judged against: past `gps_finish + delta_s` (seconds
        # after the run's start) it violates its bound; less `alone`, it is its queueing
        "jobs": {
            p.job.job_id: {
                "tenant": p.job.tenant,
                "arrival": p.job.arrival,
                "gps_finish": reference.gps[p.job.job_id],
                "alone_jct": reference.alone[p.job.job_id],
            }
            for p in workload.jobs
        },
        "avg_alone_jct": float(np.mean(list(reference.alone.values()))),
        "light_violations": {
            arm: float(np.median([light_violations(m) for m in ms])) for arm, ms in per_arm.items()
        },
        "rounds": {
            arm: [
                {
                    **figures(m),
                    "violations_by_tenant": m.violations_by_tenant,
                    "worst_slowdown_by_tenant": m.worst_slowdown,
                    "mean_slowdown_by_tenant": m.mean_slowdown,
                    "jct_by_job": {k: round(j.jct, 4) for k, j in run.jobs.items()},
                    "calls_off_plan": run.wrong_lengths,
                    "wall_s": run.wall_s,
                    "server_mean_batch": occupancy["running"],
                    "server_mean_queue": occupancy["waiting"],
                    "process_cpu_s": occupancy["process_cpu_s"],
                }
                for m, run, occupancy in zip(
                    ms, measured.runs[arm], measured.occupancy[arm], strict=True
                )
            ]
            for arm, ms in per_arm.items()
        },
        "fairgate_ttft_ms": percentiles_ms(fairgate_ttft) if fairgate_ttft else None,
        "lone_calls": len(measured.ttft),
        # each lone call's (direct, fairgate, the server's part of fairgate's) TTFT
        "lone_calls_ms": [
            [round(c.direct * 1e3, 2), round(c.fairgate * 1e3, 2), round(c.server * 1e3, 2)]
            for c in measured.ttft
        ],
        "probe_wall_s": measured.probe_wall_s,
        "alone_wall_s": measured.alone_wall_s,
    }


def targets(report: dict[str, Any], details: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each target: the two sides and whether it holds."""
    q, t, v = report["avg_queueing"], report["throughput"], report["bound_violations"]
    added, direct = report["added_ttft_ms"]["p99"], report["direct_ttft_ms"]["p50"]
    light = details["light_violations"].get(DIRECT, 0.0)
    return {
        "queueing": _target(q[JUSTITIA], 0.7 * q[DIRECT], q[JUSTITIA] <= 0.7 * q[DIRECT]),
        "throughput": _target(t[JUSTITIA], 0.95 * t[DIRECT], t[JUSTITIA] >= 0.95 * t[DIRECT]),
        "bound_violations": _target(
            v[JUSTITIA], 0.005 * report["jobs"], v[JUSTITIA] <= 0.005 * report["jobs"] and light > 0
        )
        | {"direct_light_tenants": light},
        "added_ttft": _target(added, 0.2 * direct, added <= 0.2 * direct)
        | {"paired_p99": report["paired_added_ttft_ms"]["p99"]},
    }


def _target(value: float, bound: float, met: bool) -> dict[str, Any]:
    return {"value": value, "bound": bound, "met": bool(met)}


def table(report: dict[str, Any]) -> str:
    """The report's figures as a Markdown table, an arm a row."""
    names = (
        "avg_jct",
        "avg_queueing",
        "p99_jct",
        "throughput",
        "bound_violations",
        "worst_slowdown",
        "jain",
    )
    lines = [
        f"backend {report['backend']}: {report['jobs']} jobs, medians over rounds",
        "| arm | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for arm in report["avg_jct"]:
        cells = " | ".join(f"{report[n][arm]:.3g}" for n in names)
        lines.append(f"| {arm} | {cells} |")
    d, a, p = report["direct_ttft_ms"], report["added_ttft_ms"], report["paired_added_ttft_ms"]
    lines.append(
        f"lone calls: direct TTFT p50 {d['p50']:.1f} ms p99 {d['p99']:.1f} ms; "
        f"added by fairgate p50 {a['p50']:.1f} ms p99 {a['p99']:.1f} ms "
        f"(paired with the direct send: p50 {p['p50']:.1f} ms p99 {p['p99']:.1f} ms)"
    )
    return "\n".join(lines)
