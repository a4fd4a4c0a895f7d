"""The study plan: every policy on the same workloads, per regime and load, plus extra runs.

For each regime the engine is sized and its capacity probed on the base workload (`setup.py`);
for each load the base workload's arrival pattern is rescaled to offer that load
(`bench.workloads.load`), and every policy runs on it with oracle predictions. At the headline
point every policy also runs with noisy predictions (`noise_sigma`), and the attack pair runs
(an attacker added, lying, then telling the truth) for `attack_policies`, both through the
gateway's own planner (`bench.sim.planned`: its residual correction and error tracker learn
from what the attacker's calls really produce, as they would in the gateway); at the knee point
justitia also runs without the knee. Runs are independent simulations: with `workers > 1` they
go to a process pool. Invariant: within a cell every policy sees the same jobs, arrival times,
predictions and engine.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

from bench.sim.metrics import RunMetrics, run_metrics
from bench.sim.planned import PlannerPredictor, table_planner
from bench.sim.predictions import Predictions, lying, noisy, oracle
from bench.sim.reference import bound_slack, gps_finish, solo_call_seconds
from bench.sim.regime import Regime
from bench.sim.setup import Prepared, prepare
from bench.sim.simulator import EngineSetup, SimResult, Simulation
from bench.workloads.attack import attacker_jobs
from bench.workloads.format import Job, Node
from bench.workloads.load import at_load, solo_timeline
from tenants.policies import make_policy

RunKey = tuple[str, float, str, str]  # (regime, load, variant, policy)
ORACLE, NOISY, LIE, TRUTH, NO_KNEE = "oracle", "noisy", "lie", "truth", "no-knee"


@dataclass(frozen=True, slots=True)
class StudyConfig:
    regimes: tuple[Regime, ...]
    loads: tuple[float, ...]
    policies: tuple[str, ...]
    headline: tuple[str, float] = ("gpu", 0.9)
    knee_point: tuple[str, float] = ("cpu", 0.9)
    attack_policies: tuple[str, ...] = ("justitia",)
    noise_sigma: float = 0.4
    seed: int = 0
    workers: int = 1
    service_points: int = 200  # snapshots of cumulative service at the headline point
    share_slots: bool = False  # the dispatch core's, in every run but the capacity probe


@dataclass(frozen=True, slots=True)
class Yardstick:
    gps: dict[str, float]
    delta: float
    solo: dict[str, float]  # job id -> JCT alone on the engine
    solo_think: dict[str, float]  # job id -> what its think delays add to that


@dataclass(frozen=True, slots=True)
class Run:
    key: RunKey
    jobs: tuple[Job, ...]
    predictions: Predictions
    setup: EngineSetup
    record_s: float | None = None
    planned: bool = False  # through the gateway's planner, which learns (else the table as is)


@dataclass(slots=True)
class Outcome:
    key: RunKey
    jobs: tuple[Job, ...]
    result: SimResult
    metrics: RunMetrics


@dataclass(slots=True)
class StudyResult:
    config: StudyConfig
    prepared: dict[str, Prepared] = field(default_factory=dict)
    outcomes: dict[RunKey, Outcome] = field(default_factory=dict)
    delta: dict[tuple[str, float], float] = field(default_factory=dict)


def yardstick(jobs: Sequence[Job], prepared: Prepared) -> Yardstick:
    model = prepared.regime.step_model
    budget = prepared.setup.config.max_num_batched_tokens

    def call_seconds(node: Node) -> float:
        return solo_call_seconds(node, model, budget)

    def alone(job: Job) -> float:
        return max(end for _, end, _ in solo_timeline(job, call_seconds))

    solo = {j.job_id: alone(j) for j in jobs}
    think = {j.job_id: solo[j.job_id] - alone(without_think(j)) for j in jobs}
    return Yardstick(
        gps_finish(jobs, prepared.capacity, prepared.step_seconds),
        bound_slack(jobs, model, budget),
        solo,
        think,
    )


def without_think(job: Job) -> Job:
    return replace(job, nodes=tuple(replace(n, think_s=0.0) for n in job.nodes))


def execute(run: Run) -> SimResult:
    policy = make_policy(run.key[3])
    started = time.monotonic()
    predictor: Predictions | PlannerPredictor = run.predictions
    if run.planned:
        predictor = table_planner(run.predictions, run.setup.config.max_model_len)
    result = Simulation(run.jobs, policy, run.setup, predictor, run.record_s).run()
    regime, load, variant, name = run.key
    print(
        f"  {regime} load {load} {variant:8s} {name:10s} {result.steps:8d} steps "
        f"{time.monotonic() - started:6.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return result


def _without_knee(setup: EngineSetup) -> EngineSetup:
    return replace(setup, knee_calls=None)


class Study:
    def __init__(self, base_jobs: Sequence[Job], config: StudyConfig) -> None:
        self.base = list(base_jobs)
        self.config = config

    def run(self) -> StudyResult:
        out = StudyResult(self.config)
        runs: list[Run] = []
        sticks: dict[int, Yardstick] = {}  # by id of the workload tuple the runs share
        for regime in self.config.regimes:
            prepared = prepare(self.base, regime)
            setup = replace(prepared.setup, share_slots=self.config.share_slots)
            prepared = out.prepared[regime.name] = replace(prepared, setup=setup)
            for load in self.config.loads:
                jobs = at_load(self.base, load, prepared.capacity, prepared.step_seconds)
                cell = list(self._cell_runs(regime.name, load, jobs, prepared))
                for key, workload in {id(r.jobs): r.jobs for r in cell}.items():
                    sticks[key] = yardstick(workload, prepared)
                out.delta[regime.name, load] = sticks[id(cell[0].jobs)].delta
                runs += cell
        for run, result in zip(runs, self._execute(runs), strict=True):
            stick = sticks[id(run.jobs)]
            metrics = run_metrics(
                run.jobs, result, stick.gps, stick.delta, stick.solo, stick.solo_think
            )
            out.outcomes[run.key] = Outcome(run.key, run.jobs, result, metrics)
        return out

    def _execute(self, runs: list[Run]) -> Iterator[SimResult]:
        if self.config.workers <= 1:
            return map(execute, runs)
        pool = ProcessPoolExecutor(self.config.workers)
        with pool:
            return iter(list(pool.map(execute, runs)))

    def _cell_runs(
        self, regime: str, load: float, jobs: list[Job], prepared: Prepared
    ) -> Iterator[Run]:
        c = self.config
        setup = prepared.setup
        workload = tuple(jobs)
        truth = oracle(jobs)
        is_headline = (regime, load) == c.headline
        window = max(j.arrival for j in jobs) - min(j.arrival for j in jobs)
        record = window / c.service_points if is_headline else None
        for policy in c.policies:
            yield Run((regime, load, ORACLE, policy), workload, truth, setup, record)
        if (regime, load) == c.knee_point and setup.knee_calls is not None:
            yield Run((regime, load, NO_KNEE, "justitia"), workload, truth, _without_knee(setup))
        if not is_headline:
            return
        guessed = noisy(jobs, c.noise_sigma, c.seed)
        for policy in c.policies:
            yield Run((regime, load, NOISY, policy), workload, guessed, setup)
        attackers, claimed = attacker_jobs(jobs, prepared.context, c.seed)
        attacked = tuple(sorted([*jobs, *attackers], key=lambda j: (j.arrival, j.job_id)))
        for policy in c.attack_policies:
            honest, lie = oracle(attacked), lying(attacked, claimed)
            yield Run((regime, load, TRUTH, policy), attacked, honest, setup, planned=True)
            yield Run((regime, load, LIE, policy), attacked, lie, setup, planned=True)
