"""The share two replicas give two tenants of one saturated pool: global, or per replica.

Two gateway replicas (`running_gateway`, redis store) run in this process in front of the same
backends; tenant `light` (weight 1) sends all its jobs through the first and tenant `heavy`
(weight 2) through the second, all at once, each job `fanout` parallel calls of max_tokens/2 to
`max_tokens` output tokens (end-of-sequence ignored; the two tenants' jobs alike). Each tenant's
service is the KV token-time of its calls, each spread evenly over its run from start to finish.
Over the busy period (from the later tenant's first call until either tenant has sent its last:
both had calls waiting all along) each tenant's part of the service is compared with its
weight's part. `share_error` is the largest relative miss, |part - weight part| / weight part: 0
is the weights' split exactly; two replicas each fair only to their own jobs split about evenly,
0.5 for `light`. A tenant whose calls were granted before the other's replica had published its
work keeps that head start (the late tenant is lifted to the others' service): a transient of
about one batch, which is why the run must be long against a batch.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import anyio

from bench.replicas import ADMIN_KEY
from fairgate import AdminClient, Client
from fairgate.results import Job, JobFinished, JobState
from fairgate.v1 import gateway_pb2 as pb
from gateway.backends.settings import BackendSettings
from gateway.server import running_gateway
from gateway.settings import Settings
from gateway.share import SLACK_CALLS
from tenants.policies import kv_token_time

WEIGHTS = {"light": 1.0, "heavy": 2.0}  # tenant -> weight; each sends through its own replica


class ShareRunFailed(RuntimeError):
    """A job of the share run did not succeed."""


@dataclass(frozen=True, slots=True)
class ShareRun:
    parts: dict[str, float]  # tenant -> its part of the service over the busy period
    error: float  # the largest relative miss of a tenant's weight part
    busy_s: float
    calls: int


def _spec(index: int, fanout: int, max_tokens: int) -> pb.JobSpec:
    """The job `index` of either tenant: calls of max_tokens/2 to max_tokens output tokens
    (the same for both tenants, seeded by the job's index), so that calls do not all end
    together and freed slots come one at a time, as under a real workload."""
    rng = random.Random(index)
    nodes = []
    for i in range(fanout):
        sampling = pb.SamplingSpec(max_tokens=rng.randint(max(1, max_tokens // 2), max_tokens))
        text = f"part {i} of job {index}"
        nodes.append(pb.NodeSpec(id=f"n{i}", prompt_template=text, sampling=sampling))
    return pb.JobSpec(nodes=nodes)


async def _run(client: Client, spec: pb.JobSpec) -> Job:
    async for event in client.run_job(spec):
        if isinstance(event, JobFinished):
            if event.job.state is not JobState.SUCCEEDED:
                raise ShareRunFailed(f"{event.job.job_id} ended {event.job.state.name}")
            return event.job
    raise ShareRunFailed("a job's stream ended without JobFinished")


async def start_replicas(
    stack: contextlib.AsyncExitStack, settings: Settings, replicas: int, out: Path
) -> list[str]:
    """Start `replicas` gateways of `settings` in this process (each on a port of its own,
    with its own replica id and outbox); their addresses."""
    targets = []
    for i in range(replicas):
        replica = settings.model_copy(
            update={
                "port": 0,
                "replica_id": f"replica-{i}",
                "outbox_file": out / f"outbox-replica-{i}.jsonl",
            }
        )
        gateway = await stack.enter_async_context(running_gateway(replica))
        targets.append(f"127.0.0.1:{gateway.port}")
    return targets


def share_parts(jobs: dict[str, list[Job]]) -> tuple[dict[str, float], float]:
    """Each tenant's part of the KV token-time served over the busy period, and its length."""
    spans: dict[str, list[tuple[float, float, float]]] = {}  # tenant -> (start, end, cost)
    for tenant, results in jobs.items():
        spans[tenant] = [
            (
                _seconds(n.start_time),
                _seconds(n.finish_time),
                kv_token_time(n.prompt_tokens, n.output_tokens),
            )
            for job in results
            for n in job.nodes
        ]
    # both tenants are backlogged from the moment the later one sent its first call until the
    # first has sent its last: a tenant that arrives is lifted to the others' service (it gets
    # no credit for the time before it came), so the split before that is no one's share
    begin = max(min(start for start, _, _ in calls) for calls in spans.values())
    end = min(max(start for start, _, _ in calls) for calls in spans.values())
    served = {
        tenant: sum(
            cost * max(0.0, min(finish, end) - max(start, begin)) / max(finish - start, 1e-9)
            for start, finish, cost in calls
        )
        for tenant, calls in spans.items()
    }
    total = sum(served.values())
    return {tenant: amount / total for tenant, amount in served.items()}, end - begin


def _seconds(moment: datetime | None) -> float:
    assert moment is not None, "a succeeded node has its times"
    return moment.timestamp()


def share_error(parts: dict[str, float], weights: dict[str, float]) -> float:
    total = sum(weights.values())
    return max(abs(parts[t] - w / total) / (w / total) for t, w in weights.items())


async def measure_share(
    redis_url: str,
    backends: Sequence[BackendSettings],
    out: Path,
    *,
    per_replica: bool,
    jobs_per_tenant: int,
    fanout: int,
    max_tokens: int,
    policy: str = "justitia",
    slack_calls: float = SLACK_CALLS,
) -> ShareRun:
    """Run both tenants' jobs through two replicas on `redis_url` (a store of the run's own:
    the pool's counters start empty) and measure the split."""
    async with contextlib.AsyncExitStack() as stack:
        settings = Settings(
            admin_key=ADMIN_KEY,
            store=redis_url,
            policy=policy,
            backends=list(backends),
            per_replica_share=per_replica,
            share_slack_calls=slack_calls,
            ignore_eos=True,
            default_temperature=0.0,
        )
        targets = await start_replicas(stack, settings, len(WEIGHTS), out)
        clients = {}
        async with AdminClient(targets[0], ADMIN_KEY) as admin:
            for (tenant, weight), target in zip(WEIGHTS.items(), targets, strict=True):
                await admin.create_tenant(
                    tenant, weight=weight, max_tokens_ceiling=max_tokens, default_max_tokens=1
                )
                key = (await admin.issue_key(tenant)).plaintext
                clients[tenant] = await stack.enter_async_context(Client(target, key))
        jobs: dict[str, list[Job]] = {tenant: [] for tenant in WEIGHTS}

        async def one(tenant: str, index: int) -> None:
            jobs[tenant].append(await _run(clients[tenant], _spec(index, fanout, max_tokens)))

        async with anyio.create_task_group() as tg:
            for index in range(jobs_per_tenant):
                for tenant in WEIGHTS:
                    tg.start_soon(one, tenant, index)
    parts, busy = share_parts(jobs)
    calls = sum(len(job.nodes) for results in jobs.values() for job in results)
    return ShareRun(parts, share_error(parts, WEIGHTS), busy, calls)
