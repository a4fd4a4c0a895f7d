"""The live check through 1 and 3 replicas: do several gateways order calls as one does?

The live check's workload and tiny model (`bench/live`: the study's generator, scaled down,
think delays removed; a random Llama that never stops) run on one `fairgate engine serve`
process (the check's 1 MB of KV, its prefix cache on: a server has no switch for it), behind N
`fairgate serve` processes (redis store, so the pool's order grants every call, whatever the
policy; each replica a process of its own, as deployed: replicas in one process would share one
event loop, so each added replica would slow the others' dispatch), each tenant's jobs sent
round robin over the replicas (`bench.live.replay.drive`). Every job is also run alone, one
after another, through one replica of fcfs: a job's queueing is its JCT less that. For N = 1 and
3, every serving policy, `rounds` rounds in rotated order: average JCT and queueing per run; per
N the policies ranked by their median average JCT, and justitia's median queueing over fcfs's.
As `bench/live` does, the clock is the engine's steps (the server's
`fairgate:engine_steps_total`, read before and after each run): a JCT in steps is its seconds at
the run's mean rate, a job alone takes the steps the engine ran for it; a machine shared by the
engine, the gateways, Redis and the clients slows steps, which seconds carry and steps mostly do
not. The same figures in seconds come beside them (`live_seconds_*`). With `priority` the server
schedules its queue by the calls' priority (vLLM's `--scheduling-policy priority`; `fairgate
engine serve` always does): a granted call's key in the pool's order, so that calls several
replicas sent at once run in that order.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy.stats import kendalltau

from bench.engine_servers import server_metric
from bench.live.check import LiveConfig, live_workload
from bench.live.replay import drive, output_ceiling
from bench.replicas import ADMIN_KEY
from bench.replicas.gateways import GatewayReplica, running
from bench.workloads.format import Job
from fairgate.results import Job as JobResult
from fairgate.results import JobState
from gateway.backends.settings import BackendSettings

POLICIES = ("fcfs", "vtc", "justitia", "las")
STEPS = "fairgate:engine_steps_total"
REPLICAS = (1, 3)


def _jct(result: JobResult) -> float:
    if result.state is not JobState.SUCCEEDED:
        raise RuntimeError(f"job {result.job_id} ended {result.state.name}: {result.reason}")
    assert result.create_time is not None and result.finish_time is not None
    return (result.finish_time - result.create_time).total_seconds()


@dataclass(frozen=True, slots=True)
class _Run:
    jct_s: dict[str, float]  # job id -> its JCT in seconds
    steps: float  # the engine's steps over the run
    wall_s: float

    def jct_steps(self) -> dict[str, float]:
        """Each JCT in steps at the run's mean rate (seconds per step, idle included)."""
        return {job: jct * self.steps / self.wall_s for job, jct in self.jct_s.items()}


async def _run(
    replicas: int,
    policy: str,
    redis_url: str,
    backend: BackendSettings,
    directory: Path,
    jobs: Sequence[Job],
    scale: float,
    ceiling: int,
) -> _Run:
    """Each job's JCT through `replicas` gateway processes with `policy`, and the steps the
    engine ran."""
    assert backend.url is not None
    settings = {
        "admin_key": ADMIN_KEY,
        "policy": policy,
        "default_temperature": "0.0",
        "hidden_refine": "false",
    }
    gateways = [
        GatewayReplica(f"live{replicas}-{i}", redis_url, directory, [backend], settings)
        for i in range(replicas)
    ]
    async with running(gateways):
        steps_before = await server_metric(backend.url, STEPS)
        start = time.monotonic()
        results, _ = await drive([g.target for g in gateways], ADMIN_KEY, jobs, scale, ceiling)
        wall = time.monotonic() - start
        steps = await server_metric(backend.url, STEPS) - steps_before
    return _Run({job_id: _jct(result) for job_id, result in results.items()}, steps, wall)


async def live_study(
    data: Path,
    directory: Path,
    redis_url: str,
    flush: Callable[[], Any],
    server_url: str,
    model: Path,
    served: str,
    rounds: int,
    priority: bool,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    config = LiveConfig(data, directory)
    jobs, _ = live_workload(config)
    ceiling = output_ceiling(jobs, config.scale)
    backend = BackendSettings(
        kind="openai",
        url=server_url,
        model=served,
        tokenizer=model,
        scrape_interval_s=0.05,
        priority=priority,
    )
    alone: dict[str, float] = {}  # job id -> JCT alone, seconds
    alone_steps: dict[str, float] = {}  # job id -> the steps the engine ran for it alone
    for job in jobs:
        await flush()
        run = await _run(
            1, "fcfs", redis_url, backend, directory, [job.at(0.0)], config.scale, ceiling
        )
        alone[job.job_id] = run.jct_s[job.job_id]
        alone_steps[job.job_id] = run.steps
    log(f"live: {len(jobs)} jobs alone, mean JCT {statistics.mean(alone.values()):.2f} s")
    runs: dict[int, dict[str, list[_Run]]] = {n: {p: [] for p in POLICIES} for n in REPLICAS}
    arms = [(n, p) for n in REPLICAS for p in POLICIES]
    for round_ in range(rounds):
        shift = round_ * 3 % len(arms)
        for n, policy in arms[shift:] + arms[:shift]:
            await flush()
            run = await _run(n, policy, redis_url, backend, directory, jobs, config.scale, ceiling)
            runs[n][policy].append(run)
            log(
                f"live {n} replicas {policy:9s} avg JCT {statistics.mean(run.jct_s.values()):.2f} s"
                f", {statistics.mean(run.jct_steps().values()):.0f} steps"
            )

    def figures(jct: Callable[[_Run], dict[str, float]], lone: dict[str, float]) -> Figures:
        avg: dict[int, dict[str, list[float]]] = {n: {} for n in REPLICAS}
        waits: dict[int, dict[str, list[float]]] = {n: {} for n in REPLICAS}
        for n, by_policy in runs.items():
            for p, rs in by_policy.items():
                avg[n][p] = [statistics.mean(jct(r).values()) for r in rs]
                waits[n][p] = [statistics.mean(jct(r)[j] - lone[j] for j in lone) for r in rs]
        return Figures(avg, waits)

    seconds = figures(lambda r: r.jct_s, alone)
    steps = figures(_Run.jct_steps, alone_steps)
    return (
        steps.summary("live_")
        | seconds.summary("live_seconds_")
        | {
            "live_jobs": len(jobs),
            "live_alone_mean_s": statistics.mean(alone.values()),
            "live_alone_mean_steps": statistics.mean(alone_steps.values()),
            "live_step_ms": {
                str(n): {p: [r.wall_s / r.steps * 1e3 for r in rs] for p, rs in v.items()}
                for n, v in runs.items()
            },
        }
    )


@dataclass(frozen=True, slots=True)
class Figures:
    """Per number of replicas and policy, each run's average JCT and queueing (one unit)."""

    avg_jct: dict[int, dict[str, list[float]]]
    avg_queueing: dict[int, dict[str, list[float]]]

    def summary(self, prefix: str) -> dict[str, Any]:
        """The policies ranked by median average JCT per N, Kendall's tau between the two
        rankings, justitia's median queueing over fcfs's per N, and every run."""
        medians = {
            n: {p: statistics.median(v) for p, v in by.items()} for n, by in self.avg_jct.items()
        }
        waits = {
            n: {p: statistics.median(v) for p, v in by.items()}
            for n, by in self.avg_queueing.items()
        }
        ranked = {n: sorted(POLICIES, key=medians[n].__getitem__) for n in REPLICAS}
        one, three = REPLICAS
        tau = kendalltau([medians[one][p] for p in POLICIES], [medians[three][p] for p in POLICIES])
        ratio = {n: waits[n]["justitia"] / waits[n]["fcfs"] for n in REPLICAS}
        return {
            f"{prefix}ranking": {str(n): ranked[n] for n in REPLICAS},
            f"{prefix}kendall_tau": float(tau.statistic),
            f"{prefix}queueing_justitia_over_fcfs": {str(n): ratio[n] for n in REPLICAS},
            f"{prefix}ratio_change": ratio[three] / ratio[one] - 1.0,
            f"{prefix}runs": {
                str(n): {
                    p: {"avg_jct": self.avg_jct[n][p], "avg_queueing": self.avg_queueing[n][p]}
                    for p in POLICIES
                }
                for n in REPLICAS
            },
        }
