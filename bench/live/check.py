"""The live check: do the real gateway and engine rank the policies as the
simulation does, on the same workload?

Workload: the study's generator (`--jobs`, `--seed`), with think delays removed (a JobSpec cannot
carry them: the gateway runs a job's DAG as fast as its calls allow) and the jobs the gateway
refuses for their shape dropped (a chain deeper than 32 calls); token counts are scaled by
`--scale` (`bench.workloads.replay.to_job_spec`) and the arrivals rescaled to span `--window-s`.
Live: every policy but sjf-oracle (the gateway has no true lengths to give it) replays it through
a gateway on the tiny model (`replay.py`, `model.py`), one fresh gateway per run, `--repeats`
rounds of all policies (each round in a rotated order, so a drift in the machine's load spreads
over the policies); a policy's live figure is the mean over its runs, its spread the range.
Simulation:
the same jobs with the prompt token counts the gateway reported, through `bench.sim.Simulation`
with an engine of the live one's size (no knee: the check leaves `knee_calls` unset) and the
step-time model fitted on the live runs' steps (`steps.py`), every policy, true lengths as
predictions.
Output: per policy the live and simulated average JCT, in seconds and in mean steps (a run's
average JCT over its mean busy step: on a machine shared with other work a run's speed drifts,
which seconds carry and steps mostly do not), both rankings of each, and Kendall's tau over the
policies run both ways. Invariant: live and simulated runs see the same jobs and arrival times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from scipy.stats import kendalltau

from bench.live.model import tiny_model
from bench.live.replay import ADMIN_KEY, LiveRun, output_ceiling, replay
from bench.live.steps import busy_step_s, fit_step_model
from bench.sim.predictions import oracle
from bench.sim.simulator import EngineSetup, Simulation
from bench.workloads.build import DEFAULT_CONTEXT, build_workload
from bench.workloads.format import Job, Node
from bench.workloads.replay import to_job_spec
from gateway.engine_setup import engine_config
from gateway.settings import Settings
from tenants.policies import POLICY_NAMES, SERVING_POLICY_NAMES, make_policy

GATEWAY_MAX_DEPTH = 32  # gateway.jobs.validation.JobLimits.max_depth


@dataclass(frozen=True, slots=True)
class LiveConfig:
    data: Path
    out: Path
    jobs: int = 40
    seed: int = 0
    scale: float = 0.03
    window_s: float = 5.0
    kv_cache_mb: int = 1
    policies: tuple[str, ...] = POLICY_NAMES
    repeats: int = 3


def depth(job: Job) -> int:
    level: dict[str, int] = {}
    pending = list(job.nodes)
    while pending:
        later = [n for n in pending if not all(p in level for p in n.parents)]
        for node in pending:
            if node not in later:
                level[node.node_id] = 1 + max((level[p] for p in node.parents), default=0)
        pending = later
    return max(level.values())


def live_workload(config: LiveConfig) -> tuple[list[Job], int]:
    """The scaled-down jobs (arrival offsets from 0) and how many were dropped for their depth."""
    base = build_workload(config.data, config.jobs, config.seed, DEFAULT_CONTEXT, 0.0)
    kept = [j for j in base if depth(j) <= GATEWAY_MAX_DEPTH]
    first, last = min(j.arrival for j in kept), max(j.arrival for j in kept)
    stretch = config.window_s / (last - first) if last > first else 0.0
    return [j.at((j.arrival - first) * stretch) for j in kept], len(base) - len(kept)


def as_run(job: Job, run: LiveRun, scale: float) -> Job:
    """The job as the live gateway ran it: its prompt counts, scaled outputs, no think."""
    spec = {n.id: n.sampling.max_tokens or 1 for n in to_job_spec(job, scale).nodes}
    prompts = run.jobs[job.job_id].prompt_tokens
    nodes = tuple(
        Node(n.node_id, n.parents, prompts[n.node_id], spec[n.node_id], spec[n.node_id])
        for n in job.nodes
    )
    return replace(job, nodes=nodes)


def settings_for(config: LiveConfig, policy: str, model: Path) -> Settings:
    return Settings(
        port=0,
        policy=policy,
        model=str(model),
        kv_cache_mb=config.kv_cache_mb,
        admin_key=ADMIN_KEY,
        default_temperature=0.0,
        hidden_refine=False,  # the tiny random model's states mean nothing to the artifact
    )


@dataclass(frozen=True, slots=True)
class SimRun:
    avg_jct: float
    avg_jct_steps: float  # over the mean step
    saturated_step_share: float  # steps taken while a ready call waited for room


def simulate(jobs: Sequence[Job], policy: str, setup: EngineSetup) -> SimRun:
    result = Simulation(jobs, make_policy(policy), setup, oracle(jobs)).run()
    jct = float(np.mean([result.finish[j.job_id] - j.arrival for j in jobs]))
    steps = max(1, result.steps)
    return SimRun(jct, jct * steps / result.busy_s, result.saturated_steps / steps)


def avg_jct(run: LiveRun) -> float:
    return float(np.mean([j.jct for j in run.jobs.values()]))


def avg_jct_steps(run: LiveRun) -> float:
    return avg_jct(run) / busy_step_s(run.steps)


def compare(live: dict[str, float], sim: dict[str, float]) -> dict[str, Any]:
    both = [p for p in sim if p in live]
    tau = kendalltau([live[p] for p in both], [sim[p] for p in both]).statistic
    rank_live = sorted(live, key=live.__getitem__)
    rank_sim = sorted(both, key=sim.__getitem__)
    return {
        "live": rank_live,
        "sim": rank_sim,
        "sim_all": sorted(sim, key=sim.__getitem__),
        "same": rank_live == rank_sim,
        "kendall_tau": None if math.isnan(tau) else float(tau),
    }


def run_check(config: LiveConfig, log: Any = print) -> dict[str, Any]:
    jobs, dropped = live_workload(config)
    model = tiny_model(config.out / "model")
    ceiling = output_ceiling(jobs, config.scale)
    live_policies = [p for p in config.policies if p in SERVING_POLICY_NAMES]
    runs: dict[str, list[LiveRun]] = {p: [] for p in live_policies}
    for round_ in range(config.repeats):
        shift = round_ % len(live_policies)
        for policy in live_policies[shift:] + live_policies[:shift]:
            settings = settings_for(config, policy, model)
            run = anyio.run(replay, settings, jobs, config.scale, ceiling)
            runs[policy].append(run)
            log(f"live {policy:10s} avg JCT {avg_jct(run):7.2f} s ({run.wall_s:.0f} s)")
    every = [run for policy_runs in runs.values() for run in policy_runs]
    first = every[0]
    ran = [as_run(j, first, config.scale) for j in jobs]
    step_model, between = fit_step_model([r.steps for r in every])
    engine = replace(
        engine_config(settings_for(config, "fcfs", model)),
        enable_prefix_cache=False,
        num_blocks=first.num_blocks,
    )
    setup = EngineSetup(engine, step_model, None)
    sim = {p: simulate(ran, p, setup) for p in config.policies}
    live = {p: float(np.mean([avg_jct(r) for r in rs])) for p, rs in runs.items()}
    live_steps = {p: float(np.mean([avg_jct_steps(r) for r in rs])) for p, rs in runs.items()}
    return {
        "workload": {
            "jobs": len(jobs),
            "dropped_deeper_than_32": dropped,
            "calls": sum(len(j.nodes) for j in ran),
            "output_tokens": sum(n.output_tokens for j in ran for n in j.nodes),
            "scale": config.scale,
            "window_s": config.window_s,
            "seed": config.seed,
        },
        "engine": {"num_blocks": first.num_blocks, "block_size": engine.block_size},
        "step_model": {
            **asdict(step_model),
            "between_steps_s": between,
            "steps": sum(len(r.steps.samples) for r in every),
        },
        "live": {
            p: {
                "avg_jct": live[p],
                "avg_jct_steps": live_steps[p],
                "runs_avg_jct": [avg_jct(r) for r in rs],
                "runs_avg_jct_steps": [avg_jct_steps(r) for r in rs],
                "runs_step_ms": [busy_step_s(r.steps) * 1e3 for r in rs],
                "wall_s": [r.wall_s for r in rs],
                "calls_stopped_early": sum(j.stopped_early for r in rs for j in r.jobs.values()),
            }
            for p, rs in runs.items()
        },
        "sim": {p: asdict(r) for p, r in sim.items()},
        "ranking": compare(live, {p: r.avg_jct for p, r in sim.items()}),
        "ranking_steps": compare(live_steps, {p: r.avg_jct_steps for p, r in sim.items()}),
    }
