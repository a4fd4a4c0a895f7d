"""One policy's live replay: a workload through a real gateway and engine, over gRPC.

The gateway is `gateway.server.running_gateway` on port 0 with the given policy, its engine core
built from the gateway's own settings (prefix caching off: the filler prompts would share every
block, which the simulation does not model) with a `StepRecorder` around its runner. Tenants and
their keys are made through the Admin service; each job is submitted with the fairgate SDK
(`Client.run_job`) at its arrival offset from the start and watched to its end. A job's JCT is
its finish time less its create time, both the gateway's. Invariant: every job is submitted
exactly once and its result is the gateway's final view of it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import anyio

from bench.live.steps import StepRecorder
from bench.workloads.format import Job
from bench.workloads.replay import to_job_spec
from engine import LLMEngine
from fairgate import AdminClient, Client
from fairgate.results import FinishReason, JobFinished, JobState
from fairgate.results import Job as JobResult
from gateway.engine_setup import engine_config
from gateway.gateway_protos import job_spec_to_proto
from gateway.server import running_gateway
from gateway.settings import Settings

ADMIN_KEY = "fg_admin_live_check"


@dataclass(frozen=True, slots=True)
class LiveJob:
    job_id: str
    jct: float  # seconds, by the gateway's clock
    prompt_tokens: dict[str, int]  # node id -> as the gateway counted it
    output_tokens: dict[str, int]
    stopped_early: int  # calls that ended before their max_tokens


@dataclass(frozen=True, slots=True)
class LiveRun:
    policy: str
    jobs: dict[str, LiveJob]
    steps: StepRecorder
    wall_s: float
    num_blocks: int  # the engine's KV pool, in blocks


def live_job(job: Job, result: JobResult, scale: float) -> LiveJob:
    if result.state is not JobState.SUCCEEDED:
        raise RuntimeError(f"job {job.job_id} ended {result.state.name}: {result.reason}")
    assert result.create_time is not None and result.finish_time is not None
    spec = to_job_spec(job, scale)
    wanted = {n.id: n.sampling.max_tokens for n in spec.nodes}
    early = sum(
        n.finish_reason is FinishReason.STOP or n.output_tokens != wanted[n.id]
        for n in result.nodes
    )
    return LiveJob(
        job.job_id,
        (result.finish_time - result.create_time).total_seconds(),
        {n.id: n.prompt_tokens for n in result.nodes},
        {n.id: n.output_tokens for n in result.nodes},
        early,
    )


async def _run_job(client: Client, job: Job, scale: float, start: float) -> JobResult:
    await anyio.sleep_until(start + job.arrival)
    async for event in client.run_job(job_spec_to_proto(to_job_spec(job, scale))):
        if isinstance(event, JobFinished):
            return event.job
    raise RuntimeError(f"job {job.job_id}: the stream ended without JobFinished")


async def replay(settings: Settings, jobs: Sequence[Job], scale: float, ceiling: int) -> LiveRun:
    """Run `jobs` (arrival offsets in seconds) through a gateway with `settings.policy`."""
    core = LLMEngine(
        replace(engine_config(settings), enable_prefix_cache=False), clock=time.monotonic
    )
    steps = StepRecorder(core.runner)
    core.runner = steps
    async with running_gateway(settings, core=core) as gateway:
        target = f"127.0.0.1:{gateway.port}"
        results, wall = await drive([target], settings.admin_key, jobs, scale, ceiling)
    live = {j.job_id: live_job(j, results[j.job_id], scale) for j in jobs}
    return LiveRun(settings.policy, live, steps, wall, core.block_manager.num_blocks)


async def drive(
    targets: Sequence[str], admin_key: str, jobs: Sequence[Job], scale: float, ceiling: int
) -> tuple[dict[str, JobResult], float]:
    """Make the jobs' tenants (their weights, the ceiling) through the first gateway, then send
    each job at its arrival to the gateway `targets[i % len(targets)]` for the i-th job of its
    tenant and watch it to its end; the results and the wall time."""
    results: dict[str, JobResult] = {}
    keys = {}
    async with AdminClient(targets[0], admin_key) as admin:
        for tenant in sorted({j.tenant for j in jobs}):
            weight = next(j.weight for j in jobs if j.tenant == tenant)
            await admin.create_tenant(
                tenant, weight=weight, max_tokens_ceiling=ceiling, default_max_tokens=1
            )
            keys[tenant] = (await admin.issue_key(tenant)).plaintext
    clients = {(t, target): Client(target, key) for t, key in keys.items() for target in targets}
    sent: dict[str, int] = {}
    started, start = time.monotonic(), anyio.current_time()

    async def one(job: Job, target: str) -> None:
        client = clients[job.tenant, target]
        results[job.job_id] = await _run_job(client, job, scale, start)

    try:
        async with anyio.create_task_group() as tg:
            for job in jobs:
                index = sent[job.tenant] = sent.get(job.tenant, -1) + 1
                tg.start_soon(one, job, targets[index % len(targets)])
    finally:
        for client in clients.values():
            await client.aclose()
    return results, time.monotonic() - started


def output_ceiling(jobs: Sequence[Job], scale: float) -> int:
    """The max_tokens ceiling the tenants need for the scaled jobs."""
    return max(math.ceil(n.output_tokens * scale) for j in jobs for n in j.nodes) + 1
