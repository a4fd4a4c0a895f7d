"""The live check through 1 and 3 replicas: do several gateways order calls as one does?

The live check's workload and tiny model (`bench/live`: the study's generator, scaled down,
think delays removed; a random Llama that never stops) run on one `fairgate engine serve`
process (the check's 1 MB of KV, its prefix cache on: a server has no switch for it), behind N
gateway replicas in this process (redis store, so the pool's share grants every call of vtc and
justitia), each tenant's jobs sent round robin over the replicas (`bench.live.replay.drive`).
Every job is also run alone, one after another, through one replica of fcfs: a job's queueing
is its JCT less that. For N = 1 and 3, every serving policy, `rounds` rounds in rotated order:
average JCT and queueing per run; per N the policies ranked by their median average JCT, and
justitia's median queueing over fcfs's.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scipy.stats import kendalltau

from bench.live.check import LiveConfig, live_workload
from bench.live.replay import drive, output_ceiling
from bench.replicas import ADMIN_KEY
from bench.replicas.share import start_replicas
from bench.workloads.format import Job
from fairgate.results import Job as JobResult
from fairgate.results import JobState
from gateway.backends.settings import BackendSettings
from gateway.settings import Settings

POLICIES = ("fcfs", "vtc", "justitia", "las")
REPLICAS = (1, 3)


def _jct(result: JobResult) -> float:
    if result.state is not JobState.SUCCEEDED:
        raise RuntimeError(f"job {result.job_id} ended {result.state.name}: {result.reason}")
    assert result.create_time is not None and result.finish_time is not None
    return (result.finish_time - result.create_time).total_seconds()


async def _run(
    replicas: int,
    policy: str,
    redis_url: str,
    backend: BackendSettings,
    directory: Path,
    jobs: Sequence[Job],
    scale: float,
    ceiling: int,
) -> dict[str, float]:
    """Each job's JCT through `replicas` gateways with `policy`."""
    async with contextlib.AsyncExitStack() as stack:
        settings = Settings(
            admin_key=ADMIN_KEY,
            store=redis_url,
            policy=policy,
            backends=[backend],
            default_temperature=0.0,
            hidden_refine=False,
        )
        targets = await start_replicas(stack, settings, replicas, directory)
        results, _ = await drive(targets, ADMIN_KEY, jobs, scale, ceiling)
    return {job_id: _jct(result) for job_id, result in results.items()}


async def live_study(
    data: Path,
    directory: Path,
    redis_url: str,
    flush: Callable[[], Any],
    server_url: str,
    model: Path,
    served: str,
    rounds: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    config = LiveConfig(data, directory)
    jobs, _ = live_workload(config)
    ceiling = output_ceiling(jobs, config.scale)
    backend = BackendSettings(
        kind="openai", url=server_url, model=served, tokenizer=model, scrape_interval_s=0.05
    )
    alone: dict[str, float] = {}
    for job in jobs:
        await flush()
        job_at_0 = job.at(0.0)
        jct = await _run(
            1, "fcfs", redis_url, backend, directory, [job_at_0], config.scale, ceiling
        )
        alone[job.job_id] = jct[job.job_id]
    log(f"live: {len(jobs)} jobs alone, mean JCT {statistics.mean(alone.values()):.2f} s")
    avg: dict[int, dict[str, list[float]]] = {n: {p: [] for p in POLICIES} for n in REPLICAS}
    queueing: dict[int, dict[str, list[float]]] = {n: {p: [] for p in POLICIES} for n in REPLICAS}
    arms = [(n, p) for n in REPLICAS for p in POLICIES]
    for round_ in range(rounds):
        shift = round_ * 3 % len(arms)
        for n, policy in arms[shift:] + arms[:shift]:
            await flush()
            jct = await _run(n, policy, redis_url, backend, directory, jobs, config.scale, ceiling)
            avg[n][policy].append(statistics.mean(jct.values()))
            queueing[n][policy].append(statistics.mean(jct[j] - alone[j] for j in jct))
            log(f"live {n} replicas {policy:9s} avg JCT {avg[n][policy][-1]:.2f} s")
    medians = {n: {p: statistics.median(v) for p, v in avg[n].items()} for n in REPLICAS}
    waits = {n: {p: statistics.median(v) for p, v in queueing[n].items()} for n in REPLICAS}
    ranked = {n: sorted(POLICIES, key=medians[n].__getitem__) for n in REPLICAS}
    one, three = REPLICAS
    tau = kendalltau([medians[one][p] for p in POLICIES], [medians[three][p] for p in POLICIES])
    ratio = {n: waits[n]["justitia"] / waits[n]["fcfs"] for n in REPLICAS}
    return {
        "live_ranking": {str(n): ranked[n] for n in REPLICAS},
        "live_kendall_tau": float(tau.statistic),
        "live_queueing_justitia_over_fcfs": {str(n): ratio[n] for n in REPLICAS},
        "live_ratio_change": ratio[three] / ratio[one] - 1.0,
        "live_runs": {
            str(n): {p: {"avg_jct": avg[n][p], "avg_queueing": queueing[n][p]} for p in POLICIES}
            for n in REPLICAS
        },
        "live_jobs": len(jobs),
        "live_alone_mean_s": statistics.mean(alone.values()),
    }
