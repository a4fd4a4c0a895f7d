"""The study's numbers in the issue's JSON schema, and the helpers the targets and report use.

`summary_json` writes exactly the schema of `fairgate bench sched --json`: the headline point's
average JCT per policy with oracle and with noisy predictions, its bound violations and job count;
each grid cell's average and p99 JCT, throughput and bound violations per policy; the knee ratio
(justitia with the knee over fcfs, at the knee point); the honest tenants' slowdown under attack
(lying over truthful average JCT, minus 1). `targets.py` checks the issue's goals on the same
numbers. Invariant: only the study's outcomes are read; a missing run gives None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.sim.metrics import subset_avg_jct
from bench.sim.study import LIE, NOISY, ORACLE, TRUTH, Outcome, StudyResult
from bench.workloads.attack import ATTACKER


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    value: float | None
    limit: str
    passed: bool | None  # None: not measured in this run


def cell_outcomes(out: StudyResult, regime: str, load: float, variant: str) -> dict[str, Outcome]:
    return {k[3]: o for k, o in out.outcomes.items() if k[:3] == (regime, load, variant)}


def _metric(cell: dict[str, Outcome], name: str) -> dict[str, Any]:
    return {policy: getattr(o.metrics, name) for policy, o in cell.items()}


def attack_slowdown(out: StudyResult, policy: str = "justitia") -> float | None:
    regime, load = out.config.headline
    lie = out.outcomes.get((regime, load, LIE, policy))
    truth = out.outcomes.get((regime, load, TRUTH, policy))
    if lie is None or truth is None:
        return None
    honest = {j.tenant for j in truth.jobs} - {ATTACKER}
    after = subset_avg_jct(lie.jobs, lie.result, honest)
    return after / subset_avg_jct(truth.jobs, truth.result, honest) - 1.0


def knee_ratios(out: StudyResult, variant: str = ORACLE) -> dict[str, float] | None:
    regime, load = out.config.knee_point
    justitia = out.outcomes.get((regime, load, variant, "justitia"))
    fcfs = out.outcomes.get((regime, load, ORACLE, "fcfs"))
    if justitia is None or fcfs is None:
        return None
    return {
        "avg_jct_vs_fcfs": justitia.metrics.avg_jct / fcfs.metrics.avg_jct,
        "throughput_vs_fcfs": justitia.metrics.throughput / fcfs.metrics.throughput,
    }


def summary_json(out: StudyResult) -> dict[str, Any]:
    regime, load = out.config.headline
    head = cell_outcomes(out, regime, load, ORACLE)
    headline = None
    if head:
        headline = {
            "avg_jct": _metric(head, "avg_jct"),
            "avg_queueing": _metric(head, "avg_queueing"),
            "noisy_avg_jct": _metric(cell_outcomes(out, regime, load, NOISY), "avg_jct"),
            "bound_violations": _metric(head, "bound_violations"),
            "jobs": len(next(iter(head.values())).jobs),
        }
    cells = []
    for r in out.config.regimes:
        for cell_load in out.config.loads:
            cell = cell_outcomes(out, r.name, cell_load, ORACLE)
            cells.append(
                {"regime": r.name, "load": cell_load}
                | {
                    m: _metric(cell, m)
                    for m in ("avg_jct", "avg_queueing", "p99_jct", "throughput")
                }
                | {"bound_violations": _metric(cell, "bound_violations")}
            )
    return {
        "headline": headline,
        "cells": cells,
        "cpu_knee": knee_ratios(out),
        "attack_slowdown_honest": attack_slowdown(out),
    }


def ratio(cell: dict[str, Outcome], a: str, b: str, metric: str = "avg_jct") -> float | None:
    if a not in cell or b not in cell:
        return None
    value: float = getattr(cell[a].metrics, metric) / getattr(cell[b].metrics, metric)
    return value


def make_target(name: str, value: float | None, limit: str, ok: bool | None) -> Target:
    return Target(name, value, limit, None if value is None else ok)
