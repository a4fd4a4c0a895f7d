"""`python -m bench.live.slots`: who holds the engine when one tenant's calls fill every slot.

A heavy tenant submits `--heavy-jobs` map-reduce jobs at t=0 (8 parallel calls of
`--heavy-tokens` output tokens and a short reduce each: more calls than the engine's 64 sequence
slots); two light tenants then each submit a one-call job of `--light-tokens` tokens every
`--light-every-s` seconds (`--light-jobs` each). Every arm runs the same jobs through a fresh
real gateway and engine (`bench.live.replay`, greedy, prefix caching off) with the default
model or `--model`: `fcfs`, `justitia`, `justitia` with `share_slots` (a tenant over its
weighted share of the slots yields its newest call to a waiting call of a tenant under it), and
that with the knee (`knee_calls`: past it only justitia's most urgent jobs add calls) where the
engine's throughput reaches 80 % of its full batch's, by the step model fitted on the fcfs arm's
steps and the workload's mean decoding context (`engine.step_fit.knee_calls`), and that with
`knee_calls = "auto"`: the same knee as the engine measures it from its own steps as it runs
(with `share_slots`, the knee also holds the batch while a light tenant runs: docs/ARCHITECTURE.md,
"The knee holds the batch while a light tenant runs"). `--arms` picks some of them (`fcfs`,
`justitia`, `share`, `knee-fcfs`, `knee-auto`); fcfs always runs, first.
Reported per arm: the light tenants' average JCT, the heavy tenant's, the makespan, and each
as a ratio to fcfs's; and how many light jobs ended past `gps_finish + Δ` of the run's own GPS
reference (`bench.sim.reference`: the calls' live token counts, the engine's KV pool as the
capacity, the run's mean step, Δ from the step model fitted on the run's steps).

    python -m bench.live.slots --json bench/out/slots.json [--arms share,knee-auto]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from bench.cli_args import add_names
from bench.live.replay import ADMIN_KEY, LiveRun, output_ceiling, replay
from bench.live.steps import busy_step_s, fit_step_model
from bench.sim.reference import bound_slack, gps_finish
from bench.sim.setup import mean_decode_context
from bench.workloads.format import Job, Node
from engine import StepTimeModel
from engine.step_fit import knee_calls
from gateway.engine_setup import engine_config
from gateway.settings import Settings

HEAVY, LIGHT = "heavy", ("light-a", "light-b")
# arm -> (policy, share_slots, knee: none, "fcfs" fitted from the fcfs arm's steps, or "auto");
# fcfs runs first in every study: its steps give the knee, its figures the ratios
ARMS: dict[str, tuple[str, bool, str]] = {
    "fcfs": ("fcfs", False, ""),
    "justitia": ("justitia", False, ""),
    "share": ("justitia", True, ""),
    "knee-fcfs": ("justitia", True, "fcfs"),
    "knee-auto": ("justitia", True, "auto"),
}
MAPS, PROMPT_TOKENS, REDUCE_TOKENS = 8, 32, 16
RATIOS = ("light_avg_jct_s", "heavy_avg_jct_s", "makespan_s")  # each arm's, over fcfs's


def workload(args: argparse.Namespace) -> list[Job]:
    maps = tuple(
        Node(f"map{i}", (), PROMPT_TOKENS, args.heavy_tokens, args.heavy_tokens)
        for i in range(MAPS)
    )
    reduce = Node("reduce", tuple(n.node_id for n in maps), PROMPT_TOKENS, REDUCE_TOKENS, 16)
    jobs = [
        Job(f"{HEAVY}-{i}", HEAVY, 1.0, 0.0, "map_reduce", (*maps, reduce))
        for i in range(args.heavy_jobs)
    ]
    one = Node("call", (), PROMPT_TOKENS, args.light_tokens, args.light_tokens)
    for offset, tenant in enumerate(LIGHT):
        first = args.light_start_s + offset * args.light_every_s / len(LIGHT)
        jobs += [
            Job(f"{tenant}-{k}", tenant, 1.0, first + k * args.light_every_s, "single", (one,))
            for k in range(args.light_jobs)
        ]
    return jobs


def summary(
    run: LiveRun, jobs: Sequence[Job], settings: Settings, model: StepTimeModel
) -> dict[str, float]:
    def avg(tenants: Sequence[str]) -> float:
        return statistics.fmean(run.jobs[j.job_id].jct for j in jobs if j.tenant in tenants)

    ends = [j.arrival + run.jobs[j.job_id].jct for j in jobs]
    return {
        "light_avg_jct_s": avg(LIGHT),
        "heavy_avg_jct_s": avg((HEAVY,)),
        "makespan_s": max(ends),
        **light_against_bound(run, jobs, settings, model),
    }


def with_live_counts(job: Job, run: LiveRun) -> Job:
    """The job with the token counts the gateway reported (a call may stop before its cap)."""
    live = run.jobs[job.job_id]
    nodes = tuple(
        dataclasses.replace(
            n,
            prompt_tokens=live.prompt_tokens[n.node_id],
            output_tokens=live.output_tokens[n.node_id],
        )
        for n in job.nodes
    )
    return dataclasses.replace(job, nodes=nodes)


def light_against_bound(
    run: LiveRun, jobs: Sequence[Job], settings: Settings, model: StepTimeModel
) -> dict[str, float]:
    """How many light jobs ended past `gps_finish + Δ` of the run's own GPS reference (Δ by
    `model`, fitted on the run's steps), and the latest light end against it in seconds
    (negative: every one within)."""
    ran = [with_live_counts(j, run) for j in jobs]
    config = engine_config(settings)
    finish = gps_finish(ran, run.num_blocks * config.block_size, busy_step_s(run.steps))
    delta = bound_slack(ran, model, config.max_num_batched_tokens)
    over = [
        j.arrival + run.jobs[j.job_id].jct - finish[j.job_id] - delta
        for j in ran
        if j.tenant in LIGHT
    ]
    return {"light_past_bound": sum(o > 0 for o in over), "light_worst_over_bound_s": max(over)}


async def study(args: argparse.Namespace) -> dict[str, Any]:
    jobs = workload(args)
    ceiling = output_ceiling(jobs, 1.0)
    arms: dict[str, dict[str, float]] = {}
    knee: int | None = None  # from the fcfs arm's steps, for the last arm
    chosen = ["fcfs", *(a for a in args.arms if a != "fcfs")]
    for policy, share, kneed in (ARMS[a] for a in chosen):
        settings = Settings(
            port=0,
            policy=policy,
            share_slots=share,
            knee_calls={"": None, "fcfs": knee, "auto": "auto"}[kneed],
            model=args.model,
            admin_key=ADMIN_KEY,
            default_temperature=0.0,
        )
        knee_name = {"": "", "fcfs": f"+knee {knee}", "auto": "+knee auto"}[kneed]
        name = policy + ("+share_slots" if share else "") + knee_name
        run = await replay(settings, jobs, 1.0, ceiling)
        model, _ = fit_step_model([run.steps])
        arms[name] = summary(run, jobs, settings, model)
        print(name, {k: round(v, 2) for k, v in arms[name].items()}, flush=True)
        if knee is None:
            knee = knee_calls(model, mean_decode_context(jobs), settings.max_num_seqs)
    base = arms["fcfs"]
    ratios = {name: {k: arm[k] / base[k] for k in RATIOS} for name, arm in arms.items()}
    return {"arms": arms, "to_fcfs": ratios, "jobs": len(jobs), "model": args.model, "knee": knee}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.live.slots", description=__doc__)
    p.add_argument("--json", type=Path)
    p.add_argument("--model", default="default")
    p.add_argument("--heavy-jobs", type=int, default=10)
    p.add_argument("--heavy-tokens", type=int, default=160)
    p.add_argument("--light-jobs", type=int, default=10)
    p.add_argument("--light-tokens", type=int, default=24)
    p.add_argument("--light-every-s", type=float, default=0.7)
    p.add_argument("--light-start-s", type=float, default=1.0)
    add_names(p, "--arms", ARMS, "arm", "fcfs always runs, first")
    args = p.parse_args(argv)
    result = anyio.run(study, args)
    print(json.dumps(result["to_fcfs"], indent=1))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
