"""One backend measured: probe, the largest call alone, every job alone, lone calls, the rounds.

In order, on one server that nothing else uses: a warm-up call; the capacity probe
(`capacity.py`); the workload's largest call alone (the bound's slack Δ); each job alone, direct,
one after another (its JCT alone); the lone calls' TTFTs (`lone.py`); `rounds` rounds of the
three arms in rotated order (`direct`, or a fresh gateway per fairgate arm). Between two stages the
server is waited on until its `/metrics` show nothing running or waiting (the probe's cut calls
end there). Returns the arms' runs and what they are judged against; `report.py` turns them into
figures. Invariant: every stage starts on an idle server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import anyio
import httpx

from bench.backends.capacity import Capacity, measure_capacity
from bench.backends.config import DIRECT, BenchConfig, arm_order, gateway_settings, policy_of
from bench.backends.direct import run_direct, send_one
from bench.backends.lone import ttft_pairs
from bench.backends.metrics import Reference
from bench.backends.occupancy import Occupancy, sample
from bench.backends.records import ArmRun, LoneCall
from bench.backends.through_gateway import run_through_gateway
from bench.backends.workload import Workload, as_run, burst
from bench.sim.reference import gps_finish
from bench.workloads.build import job_work
from gateway.backends.openai import KEEPALIVE_S
from gateway.backends.server_load import parse_load
from gateway.settings import Settings


class ModelServer(Protocol):
    """A running vLLM-compatible server, as the benchmark reaches it."""

    @property
    def url(self) -> str: ...

    @property
    def model(self) -> str: ...  # the model id it serves

    @property
    def model_dir(self) -> Path: ...  # the served model's folder: tokenizer, chat template


IDLE_TIMEOUT_S = 60.0
HTTP_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


@dataclass(slots=True)
class Measured:
    capacity: Capacity
    reference: Reference
    runs: dict[str, list[ArmRun]] = field(default_factory=dict)
    # per arm and round: the server's mean batch and queue, this process's CPU seconds
    occupancy: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    ttft: list[LoneCall] = field(default_factory=list)
    probe_wall_s: float = 0.0
    alone_wall_s: float = 0.0


async def wait_idle(http: httpx.AsyncClient, model: str) -> None:
    with anyio.fail_after(IDLE_TIMEOUT_S):
        while True:
            load = parse_load((await http.get("/metrics")).text, model, 0.0)
            if load.running == load.waiting == 0:
                return
            await anyio.sleep(0.2)


def _settings(server: ModelServer, arm: str, config: BenchConfig) -> Settings:
    return gateway_settings(
        policy_of(arm), server.url, server.model, server.model_dir, config.slots
    )


async def _reference(
    http: httpx.AsyncClient,
    server: ModelServer,
    workload: Workload,
    config: BenchConfig,
    log: Callable[[str], None],
) -> tuple[Capacity, Reference, float, float]:
    """The capacity, what runs are judged against, and the probe's and alone runs' wall times."""
    jobs = as_run(workload.jobs)
    half = sum(job_work(j) for j in jobs) / 2
    probe = await run_direct(http, server.model, burst(workload.jobs), "probe", until_work=half)
    capacity = measure_capacity(probe.calls, config.slots, probe.wall_s)
    log(
        f"probe: {capacity.work_per_s:.0f} KV token-time/s, step {capacity.step_seconds * 1e3:.0f}"
        f" ms, saturated {capacity.saturated_s:.1f} of {probe.wall_s:.1f} s"
    )
    await wait_idle(http, server.model)
    planned = [c for p in workload.jobs for c in p.calls]
    largest = max(planned, key=lambda c: (c.max_tokens, len(c.prompt_ids)))
    record = await send_one(http, server.model, largest, "largest")
    assert record.finished is not None
    delta = record.finished - record.sent
    started = anyio.current_time()
    alone = {}
    for p in workload.jobs:
        run = await run_direct(http, server.model, burst([p]), f"alone-{p.job.job_id}")
        alone[p.job.job_id] = run.jobs[p.job.job_id].jct
    alone_wall = anyio.current_time() - started
    log(f"largest call alone {delta:.2f} s; jobs alone: {alone_wall:.0f} s in all")
    gps = gps_finish(jobs, capacity.capacity, capacity.step_seconds)
    return capacity, Reference(gps, delta, alone), probe.wall_s, alone_wall


async def _run_arm(
    http: httpx.AsyncClient,
    server: ModelServer,
    arm: str,
    round_: int,
    workload: Workload,
    config: BenchConfig,
) -> tuple[ArmRun, dict[str, float]]:
    """One arm's run, and meanwhile the server's mean batch and queue and the CPU time this
    process took (the clients, and the gateway of a fairgate arm: on a small machine it takes
    it from the server)."""
    occupancy = Occupancy()
    cpu = time.process_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sample, http, server.model, occupancy)
        if arm == DIRECT:
            run = await run_direct(http, server.model, workload.jobs, f"r{round_}")
            run = replace(run, arm=DIRECT)
        else:
            run = await run_through_gateway(_settings(server, arm, config), workload)
        tg.cancel_scope.cancel()
    return run, occupancy.means() | {"process_cpu_s": time.process_time() - cpu}


async def measure_backend(
    server: ModelServer, workload: Workload, config: BenchConfig, log: Callable[[str], None]
) -> Measured:
    limits = httpx.Limits(
        max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S
    )
    async with httpx.AsyncClient(
        base_url=server.url, timeout=HTTP_TIMEOUT, limits=limits, trust_env=False
    ) as http:
        await send_one(http, server.model, workload.jobs[0].calls[0], "warm-up")
        capacity, reference, probe_s, alone_s = await _reference(
            http, server, workload, config, log
        )
        measured = Measured(capacity, reference, probe_wall_s=probe_s, alone_wall_s=alone_s)
        await wait_idle(http, server.model)
        settings = _settings(server, "fairgate-justitia", config)
        measured.ttft = await ttft_pairs(http, server.model, settings, workload, config.lone_calls)
        log(f"lone calls: {len(measured.ttft)} timed each way")
        for round_ in range(config.rounds):
            for arm in arm_order(round_):
                await wait_idle(http, server.model)
                run, occupancy = await _run_arm(http, server, arm, round_, workload, config)
                measured.runs.setdefault(arm, []).append(run)
                measured.occupancy.setdefault(arm, []).append(occupancy)
                jcts = [j.jct for j in run.jobs.values()]
                log(
                    f"round {round_} {arm:18s} avg JCT {sum(jcts) / len(jcts):6.2f} s, "
                    f"wall {run.wall_s:5.1f} s, batch {occupancy['running']:4.1f}, server queue "
                    f"{occupancy['waiting']:4.1f}, calls off plan {run.wrong_lengths}"
                )
    return measured
