"""The robust-scheduling goals (issue 20, points 1 to 4) on a study's outcomes (as `summary.py`).

Each target is a measured value, its limit as text, and pass / fail / not measured (None). At the
headline point: justitia's average queueing (JCT less the job alone, the part an order changes)
over vtc's, fcfs's and sjf-oracle's; the share of its jobs past `gps_finish + Δ` with exact and
with noisy predictions; the honest tenants' slowdown when a tenant lies. "No regression" compares
justitia in every grid cell with the better (lower average JCT) of fcfs and vtc, for JCT and
throughput (the worst cell's ratio), and the `cpu` knee keeps its gain over fcfs. Weighted
fairness (point 5) needs its own saturated run (`bench.sim.weighted`). Invariant: pure
functions of the outcomes.
"""

from __future__ import annotations

from bench.sim.study import NOISY, ORACLE, Outcome, StudyResult
from bench.sim.summary import Target, attack_slowdown, cell_outcomes, knee_ratios, make_target
from bench.sim.summary import ratio as jct_ratio

# justitia's average queueing at most these times each baseline's (issue 20, point 1)
QUEUEING_LIMITS = (("vtc", 0.7), ("fcfs", 0.5), ("sjf-oracle", 1.1))
EXACT_SHARE, NOISY_SHARE = 0.002, 0.005  # of the jobs past the bound (point 2)
ATTACK_LIMIT = 0.05  # the honest tenants' average JCT slowdown under attack (point 3)


def _headline_targets(out: StudyResult) -> list[Target]:
    regime, load = out.config.headline
    head = cell_outcomes(out, regime, load, ORACLE)
    noisy = cell_outcomes(out, regime, load, NOISY)
    targets = []
    for other, limit in QUEUEING_LIMITS:
        value = jct_ratio(head, "justitia", other, "avg_queueing")
        name = f"1. queueing justitia / {other}"
        targets.append(
            make_target(name, value, f"<= {limit}", value is not None and value <= limit)
        )
    for label, cell, limit in (("exact", head, EXACT_SHARE), ("noisy", noisy, NOISY_SHARE)):
        share = _violation_share(cell)
        targets.append(
            make_target(
                f"2. past the bound, {label}",
                share,
                f"<= {limit}",
                share is not None and share <= limit,
            )
        )
    return targets


def _violation_share(cell: dict[str, Outcome]) -> float | None:
    if "justitia" not in cell:
        return None
    return cell["justitia"].metrics.bound_violations / len(cell["justitia"].jobs)


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
            "4. worst cell JCT / best of fcfs, vtc",
            worst_jct,
            "<= 1.03",
            worst_jct is not None and worst_jct <= 1.03,
        ),
        make_target(
            "4. worst cell throughput / best of fcfs, vtc",
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
        make_target("4. cpu knee JCT / fcfs", jct, "<= 0.8", jct is not None and jct <= 0.8),
        make_target(
            "4. cpu knee throughput / fcfs",
            thr,
            ">= 0.95",
            thr is not None and thr >= 0.95,
        ),
        make_target(
            "3. attack: honest tenants' slowdown",
            attack,
            f"<= {ATTACK_LIMIT}",
            attack is not None and attack <= ATTACK_LIMIT,
        ),
    ]
