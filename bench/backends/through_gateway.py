"""The fairgate arms: the same jobs through a fresh in-process gateway in front of the server.

`open_gateway` starts `gateway.server.running_gateway` on port 0 with one `openai` backend (the
server under test), the policy of the arm, greedy sampling and `ignore_eos`, and makes the
workload's tenants (their weights, a max_tokens ceiling the jobs need) and a key for each through
the Admin service. `run_through_gateway` submits each job with the fairgate SDK
(`Client.run_job`) at its arrival offset and takes its finish when the client sees JobFinished:
the same clock and the same two ends as the direct arm. A node that ran a different prompt or
output length than planned (the anomaly guard capped it, the server stopped it) is counted, so the
report can say whether the arms generated the same tokens. Invariant: every job is submitted
exactly once, and one that does not succeed stops the benchmark.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import anyio
from opentelemetry.sdk.trace import TracerProvider

from bench.backends.config import ADMIN_KEY
from bench.backends.records import ArmRun, JobRecord
from bench.backends.workload import PlannedJob, Workload
from fairgate import AdminClient, Client
from fairgate.results import Job as JobResult
from fairgate.results import JobFinished, JobState, NodeState
from gateway.gateway_protos import job_spec_to_proto
from gateway.server import running_gateway
from gateway.settings import Settings

DEADLINE_S = 1800.0  # a run still going after this long is stuck, not slow


class GatewayJobFailed(RuntimeError):
    """A job did not succeed through the gateway."""


@dataclass(frozen=True, slots=True)
class OpenGateway:
    target: str  # host:port of its gRPC server
    keys: dict[str, str]  # tenant -> API key


@contextlib.asynccontextmanager
async def open_gateway(
    settings: Settings,
    tenants: dict[str, float],
    ceiling: int,
    tracer_provider: TracerProvider | None = None,
) -> AsyncIterator[OpenGateway]:
    async with running_gateway(settings, tracer_provider=tracer_provider) as gateway:
        target = f"127.0.0.1:{gateway.port}"
        keys = {}
        async with AdminClient(target, ADMIN_KEY) as admin:
            for tenant, weight in sorted(tenants.items()):
                await admin.create_tenant(
                    tenant, weight=weight, max_tokens_ceiling=ceiling, default_max_tokens=1
                )
                keys[tenant] = (await admin.issue_key(tenant)).plaintext
        yield OpenGateway(target, keys)


def wrong_nodes(planned: PlannedJob, result: JobResult) -> int:
    """Nodes whose prompt or output count is not the plan's."""
    wanted = {c.node_id: (len(c.prompt_ids), c.max_tokens) for c in planned.calls}
    return sum(
        n.state is not NodeState.SUCCEEDED or (n.prompt_tokens, n.output_tokens) != wanted[n.id]
        for n in result.nodes
    )


async def _run_job(
    client: Client, planned: PlannedJob, running: dict[str, tuple[str, str]]
) -> JobResult:
    job_id = planned.job.job_id
    async for event in client.run_job(job_spec_to_proto(planned.spec)):
        running.setdefault(job_id, (planned.job.tenant, event.job_id))
        if isinstance(event, JobFinished):
            return event.job
    raise GatewayJobFailed(f"job {planned.job.job_id}: the stream ended without JobFinished")


async def _stuck(clients: dict[str, Client], submitted: dict[str, tuple[str, str]]) -> str:
    """What the gateway says of the jobs still running, node by node."""
    lines = []
    for job_id, (tenant, gateway_id) in sorted(submitted.items()):
        job = await clients[tenant].get_job(gateway_id)
        states = ", ".join(f"{n.id} {n.state.name}" for n in job.nodes)
        lines.append(f"{job_id} ({gateway_id}) {job.state.name}: {states}")
    return "\n".join(lines)


async def run_through_gateway(
    settings: Settings,
    workload: Workload,
    jobs: Sequence[PlannedJob] | None = None,
    deadline_s: float = DEADLINE_S,
) -> ArmRun:
    """Run `jobs` (default: the workload's) through a fresh gateway with `settings.policy`;
    GatewayJobFailed, naming what is still running, when they have not ended by `deadline_s`."""
    todo = workload.jobs if jobs is None else jobs
    records: dict[str, JobRecord] = {}
    running: dict[str, tuple[str, str]] = {}  # job id -> (tenant, the gateway's job id)
    wrong = 0
    async with open_gateway(settings, workload.tenants, workload.ceiling) as gateway:
        clients = {t: Client(gateway.target, key) for t, key in gateway.keys.items()}
        start = anyio.current_time()

        async def one(planned: PlannedJob) -> None:
            nonlocal wrong
            job = planned.job
            await anyio.sleep_until(start + job.arrival)
            result = await _run_job(clients[job.tenant], planned, running)
            del running[job.job_id]
            finished = anyio.current_time() - start
            if result.state is not JobState.SUCCEEDED:
                raise GatewayJobFailed(
                    f"job {job.job_id} ended {result.state.name}: {result.reason}"
                )
            wrong += wrong_nodes(planned, result)
            records[job.job_id] = JobRecord(job.job_id, job.tenant, job.arrival, finished)

        try:
            with anyio.move_on_after(deadline_s) as deadline:
                async with anyio.create_task_group() as tg:
                    for planned in todo:
                        tg.start_soon(one, planned)
            if deadline.cancelled_caught:
                stuck = await _stuck(clients, running)
                raise GatewayJobFailed(f"{settings.policy}: not done in {deadline_s} s:\n{stuck}")
        finally:
            for client in clients.values():
                await client.aclose()
        wall = anyio.current_time() - start
    return ArmRun(f"fairgate-{settings.policy}", records, (), wrong, wall)
