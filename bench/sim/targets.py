"""The issue's goals 1 to 6, evaluated on a study's outcomes (numbers as in `summary.py`).

Each target is a measured value, its limit as text, and pass / fail / not measured. "No
regression" compares justitia in every grid cell with the better (lower average JCT) of fcfs and
vtc, for JCT and throughput; the reported value is the worst cell's ratio. The sjf-oracle check
counts its bound violations among the heavy tenant's jobs (the tenant with the most offered
work). Invariant: pure functions of the outcomes.
"""

from __future__ import annotations

from collections import defaultdict

from bench.sim.study import NOISY, ORACLE, Outcome, StudyResult
from bench.sim.summary import Target, attack_slowdown, cell_outcomes, knee_ratios, make_target
from bench.sim.summary import ratio as jct_ratio
from bench.workloads.build import job_work


def heavy_tenant(outcome: Outcome) -> str:
    work: dict[str, float] = defaultdict(float)
    for job in outcome.jobs:
        work[job.tenant] += job_work(job)
    return max(work, key=work.__getitem__)


def _headline_targets(out: StudyResult) -> list[Target]:
    regime, load = out.config.headline
    head = cell_outcomes(out, regime, load, ORACLE)
    noisy = cell_outcomes(out, regime, load, NOISY)
    targets = []
    for other, limit in (("vtc", 0.6), ("fcfs", 0.5), ("sjf-oracle", 1.1)):
        value = jct_ratio(head, "justitia", other)
        name = f"1. headline avg JCT justitia / {other}"
        targets.append(
            make_target(name, value, f"<= {limit}", value is not None and value <= limit)
        )
    violations = head["justitia"].metrics.bound_violations if "justitia" in head else None
    targets.append(
        make_target("4. headline bound violations, justitia", violations, "== 0", violations == 0)
    )
    sjf = head.get("sjf-oracle")
    if sjf is not None:
        broken = sjf.metrics.violations_by_tenant.get(heavy_tenant(sjf), 0)
        targets.append(
            make_target(
                "4. sjf-oracle breaks the bound for the heavy tenant", broken, "> 0", broken > 0
            )
        )
    value = jct_ratio(noisy, "justitia", "vtc")
    targets.append(
        make_target(
            "5. noisy avg JCT justitia / vtc", value, "<= 0.7", value is not None and value <= 0.7
        )
    )
    if "justitia" in noisy:
        share = noisy["justitia"].metrics.bound_violations / len(noisy["justitia"].jobs)
        targets.append(
            make_target(
                "5. noisy bound-violation share, justitia", share, "<= 0.005", share <= 0.005
            )
        )
    return targets


def _regression_targets(out: StudyResult) -> list[Target]:
    worst_jct: float | None = None
    worst_thr: float | None = None
    for regime in out.config.regimes:
        for load in out.config.loads:
            cell = cell_outcomes(out, regime.name, load, ORACLE)
            if not {"justitia", "fcfs", "vtc"} <= cell.keys():
                continue
            best = min(("fcfs", "vtc"), key=lambda p: cell[p].metrics.avg_jct)
            jct = cell["justitia"].metrics.avg_jct / cell[best].metrics.avg_jct
            thr = cell["justitia"].metrics.throughput / cell[best].metrics.throughput
            worst_jct = jct if worst_jct is None else max(worst_jct, jct)
            worst_thr = thr if worst_thr is None else min(worst_thr, thr)
    return [
        make_target(
            "2. worst cell: justitia avg JCT / best of fcfs, vtc",
            worst_jct,
            "<= 1.03",
            worst_jct is not None and worst_jct <= 1.03,
        ),
        make_target(
            "2. worst cell: justitia throughput / best of fcfs, vtc",
            worst_thr,
            ">= 0.97",
            worst_thr is not None and worst_thr >= 0.97,
        ),
    ]


def check_targets(out: StudyResult) -> list[Target]:
    knee = knee_ratios(out)
    attack = attack_slowdown(out)
    jct = knee["avg_jct_vs_fcfs"] if knee else None
    thr = knee["throughput_vs_fcfs"] if knee else None
    return [
        *_headline_targets(out),
        *_regression_targets(out),
        make_target(
            "3. cpu knee: justitia avg JCT / fcfs", jct, "<= 0.8", jct is not None and jct <= 0.8
        ),
        make_target(
            "3. cpu knee: justitia throughput / fcfs",
            thr,
            ">= 0.95",
            thr is not None and thr >= 0.95,
        ),
        make_target(
            "6. attack: honest tenants' avg JCT slowdown",
            attack,
            "<= 0.10",
            attack is not None and attack <= 0.10,
        ),
    ]
