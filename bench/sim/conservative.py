"""Conservative mode in the simulator: a tenant whose outputs drift, with and without it.

The workload (`bench.workloads.drift`) has honest tenants and one whose outputs turn from short
to long half-way. Predictions come from the gateway's own `CallPlanner` (`gateway/calls.py`)
over a history predictor that learned every tenant's calls of the first half and learns nothing
after (`FrozenHistory`), so the drifting tenant's predictions keep its short history. The engine
is sized and probed on the workload (`bench.sim.setup.prepare`), arrivals are rescaled to the
load, and the same jobs run twice through the simulator under one policy: with the planner's
`ErrorTracker` at the gateway's thresholds (a tenant's kind of call whose predictions keep
missing is ordered and reserved by its p90 widened to what its calls were seen to produce;
otherwise a call is ordered by its mean and reserved at its p90) and without a tracker.
Figures: the honest tenants' bound violations (`finish > gps_finish + Δ`) and worst slowdown
(JCT over GPS JCT) in each run, and the switch: when the first drifted call was planned in
conservative mode, and how many drifted calls had finished by then (at most one tracker
window). Each seed is a workload of its own. Invariant: both runs of a seed see the same jobs,
engine, history and GPS reference; only the tracker differs.

    python -m bench.sim.conservative --json conservative.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.sim.metrics import RunMetrics, run_metrics
from bench.sim.planned import PlanLog, PlannerPredictor, features
from bench.sim.regime import cpu_regime, gpu_regime
from bench.sim.setup import Prepared, prepare
from bench.sim.simulator import Simulation
from bench.sim.study import Yardstick, yardstick
from bench.workloads.drift import LONG, SHORT, DriftWorkload
from bench.workloads.format import Job
from bench.workloads.load import at_load
from gateway.calls import CallDefaults, CallPlanner
from gateway.server import LENGTH_PRIOR
from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from predictor.error_tracker import ErrorTracker
from predictor.history import HistoryPredictor
from tenants.policies import POLICY_NAMES, kv_token_time, make_policy

WITH, WITHOUT = "conservative", "plain"
RUNS = (WITH, WITHOUT)


class FrozenHistory(HistoryPredictor):
    """A history predictor that learned `history` (calls and their true lengths, in order) and
    learns nothing more: its predictions keep that history whatever the calls produce later."""

    def __init__(
        self, prior: LengthDistribution, history: Iterable[tuple[CallFeatures, int]]
    ) -> None:
        super().__init__(prior)
        for call, length in history:
            super().observe(call, length)

    def observe(self, call: CallFeatures, true_len: int) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Experiment:
    workload: DriftWorkload = field(default_factory=DriftWorkload)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # each replaces the workload's seed
    regime: str = "gpu"
    load: float = 1.0  # offered over the whole arrival window (`bench.workloads.load`)
    policy: str = "justitia"


@dataclass(frozen=True, slots=True)
class Outcome:
    metrics: RunMetrics
    log: PlanLog


def run_experiment(exp: Experiment) -> dict[str, Any]:
    """Both runs on each seed's workload: the JSON `main` writes."""
    seeds = [run_seed(replace(exp.workload, seed=seed), exp) for seed in exp.seeds]
    return {
        "experiment": {
            "regime": exp.regime,
            "load": exp.load,
            "policy": exp.policy,
            "workload": asdict(exp.workload) | {"seed": list(exp.seeds)},
            "tracker_window": ErrorTracker().window,
        },
        "seeds": seeds,
        "others_violations": {r: [s["others_violations"][r] for s in seeds] for r in RUNS},
        "others_worst_slowdown": {r: [s["others_worst_slowdown"][r] for s in seeds] for r in RUNS},
        "switch_after_drifted_calls": [s["switch"]["drifted_calls_before"] for s in seeds],
        "seeds_met": sum(s["met"] for s in seeds),
        "targets_met": all(s["met"] for s in seeds),
    }


def run_seed(workload: DriftWorkload, exp: Experiment) -> dict[str, Any]:
    """One workload, with and without the tracker: the figures and whether they meet the
    targets (fewer violations and a lower worst slowdown for the others, the switch within a
    window of drifted calls)."""
    base = workload.build()
    prepared = prepare(base, gpu_regime() if exp.regime == "gpu" else cpu_regime())
    jobs = at_load(base, exp.load, prepared.capacity, prepared.step_seconds)
    stick = yardstick(jobs, prepared)
    first_half = {j.job_id for j in base if j.arrival < workload.drift_at}
    history = [
        (features(j, n), n.output_tokens) for j in jobs if j.job_id in first_half for n in j.nodes
    ]
    runs = {
        name: simulate(jobs, exp.policy, prepared, stick, history, tracked=name == WITH)
        for name in RUNS
    }
    honest = sorted(workload.honest)
    violations = {r: sum(runs[r].metrics.violations_by_tenant[t] for t in honest) for r in RUNS}
    worst = {r: max(runs[r].metrics.worst_slowdown[t] for t in honest) for r in RUNS}
    drift_s = min(j.arrival for j in jobs if j.kind == LONG)
    log = runs[WITH].log
    switch_s = log.first_conservative.get(LONG)
    before = log.finished_before.get(LONG)
    window = ErrorTracker().window
    return {
        "seed": workload.seed,
        "jobs": len(jobs),
        "delta_s": stick.delta,
        "drift_s": drift_s,  # the first drifted job's arrival
        "offered_load": offered_load(jobs, drift_s, prepared),
        "others_violations": violations,
        "others_worst_slowdown": worst,
        "switch": {
            "at_s": switch_s,
            "after_drift_s": None if switch_s is None else switch_s - drift_s,
            "drifted_calls_before": before,
            "conservative_before_drift": log.conservative[SHORT],
        },
        "met": violations[WITH] < violations[WITHOUT]
        and worst[WITH] < worst[WITHOUT]
        and before is not None
        and before <= window,
        "runs": {
            r: {
                "planned_conservative": dict(sorted(runs[r].log.conservative.items())),
                "metrics": runs[r].metrics.to_json(),
            }
            for r in RUNS
        },
    }


def simulate(
    jobs: Sequence[Job],
    policy: str,
    prepared: Prepared,
    stick: Yardstick,
    history: Sequence[tuple[CallFeatures, int]],
    tracked: bool,
) -> Outcome:
    tracker = ErrorTracker() if tracked else None
    defaults = CallDefaults(max_model_len=prepared.context)
    planner = CallPlanner(FrozenHistory(LENGTH_PRIOR, history), None, defaults, None, tracker)
    predictor = PlannerPredictor(planner, prepared.context)
    result = Simulation(jobs, make_policy(policy), prepared.setup, predictor).run()
    metrics = run_metrics(jobs, result, stick.gps, stick.delta, stick.solo, stick.solo_think)
    return Outcome(metrics, predictor.log)


def offered_load(jobs: Sequence[Job], drift_s: float, prepared: Prepared) -> dict[str, float]:
    """KV token-time of the jobs arriving before and after the drift over what the engine
    serves in that span: how far the drift pushes the load."""
    work = {False: 0.0, True: 0.0}  # arrived after the drift -> KV token-time
    for job in jobs:
        work[job.arrival >= drift_s] += sum(
            kv_token_time(n.prompt_tokens, n.output_tokens) for n in job.nodes
        )
    end, rate = max(j.arrival for j in jobs), prepared.work_per_second
    return {
        "before_drift": work[False] / (drift_s * rate),
        "after_drift": work[True] / ((end - drift_s) * rate),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.sim.conservative",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = Experiment()
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--jobs-per-tenant", type=int, default=defaults.workload.jobs_per_tenant)
    p.add_argument("--seeds", type=int, nargs="+", default=list(defaults.seeds))
    p.add_argument("--regime", choices=["gpu", "cpu"], default=defaults.regime)
    p.add_argument("--load", type=float, default=defaults.load)
    p.add_argument("--policy", choices=POLICY_NAMES, default=defaults.policy)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the summary; exits 1 when a seed misses the targets."""
    args = parse_args(argv)
    workload = DriftWorkload(jobs_per_tenant=args.jobs_per_tenant)
    exp = Experiment(workload, tuple(args.seeds), args.regime, args.load, args.policy)
    out = run_experiment(exp)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in out.items() if k != "seeds"}, indent=1))
    return 0 if out["targets_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
