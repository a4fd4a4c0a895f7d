"""A real gateway on port 0 with real aio clients, and the checks every reliability test ends with.

`reliable_gateway` starts a gateway over the simulated engine (or a given core and store) and
creates tenants through the Admin API. After its hostile scenario each test calls `unharmed`:
health answers SERVING within a second, an ordinary job of a bystander tenant succeeds, and for
every tenant GetUsage shows no reservation left and settled usage equal to the tokens of the
calls that finished (nodes SUCCEEDED or CAPPED in the jobs the test ran).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

from engine import LLMEngine
from fairgate.v1 import admin_pb2, admin_pb2_grpc, gateway_pb2_grpc
from fairgate.v1 import gateway_pb2 as pb
from gateway.server import RunningGateway, running_gateway
from gateway.settings import Settings
from tenants import MemoryQuotaStore, QuotaStore
from tests.gateway.conftest import ADMIN_KEY, sim_core

BYSTANDER = "bystander"
DONE = (pb.NODE_STATE_SUCCEEDED, pb.NODE_STATE_CAPPED)


def node(node_id: str, prompt: str, max_tokens: int = 8, *deps: str) -> pb.NodeSpec:
    sampling = pb.SamplingSpec(max_tokens=max_tokens)
    return pb.NodeSpec(id=node_id, prompt_template=prompt, depends_on=deps, sampling=sampling)


def roots(count: int, max_tokens: int = 8) -> pb.JobSpec:
    return pb.JobSpec(nodes=[node(f"n{i}", f"say {i}", max_tokens) for i in range(count)])


async def reruns(events: AsyncIterator[pb.JobEvent]) -> tuple[dict[str, str], pb.Job | None]:
    """From a job's watch stream to its end: each node sent back to READY to run again, with
    its reason, and the final job (None if the stream ended without one)."""
    again: dict[str, str] = {}
    final = None
    async for event in events:
        kind = event.WhichOneof("event")
        change = event.node_state_changed
        if kind == "node_state_changed" and change.node.state == pb.NODE_STATE_READY:
            again[change.node.id] = change.node.reason
        elif kind == "job_finished":
            final = event.job_finished.job
    return again, final


@dataclass
class Reliable:
    gateway: RunningGateway
    channel: grpc.aio.Channel
    stub: gateway_pb2_grpc.GatewayStub
    admin: admin_pb2_grpc.AdminStub
    health: health_pb2_grpc.HealthStub
    keys: dict[str, str] = field(default_factory=dict)
    jobs: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def auth(self, tenant: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {self.keys[tenant]}"),)

    @property
    def admin_auth(self) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {ADMIN_KEY}"),)

    async def tenant(self, tenant: str, **quota: Any) -> str:
        """Create a tenant with a key through the Admin API; returns the key."""
        request = admin_pb2.CreateTenantRequest(
            tenant_id=tenant, quota=admin_pb2.TenantQuota(**quota)
        )
        await self.admin.CreateTenant(request, metadata=self.admin_auth)
        issued = await self.admin.IssueKey(
            admin_pb2.IssueKeyRequest(tenant_id=tenant), metadata=self.admin_auth
        )
        self.keys[tenant] = issued.plaintext
        return issued.plaintext

    async def submit(self, tenant: str, spec: pb.JobSpec) -> pb.Job:
        job = await self.stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=self.auth(tenant))
        self.jobs[tenant].append(job.job_id)
        return job

    async def outbox_used(self) -> None:
        """Return once a quota close waits in the outbox (the store is away)."""
        with anyio.fail_after(10):
            await self.gateway.dispatcher.outbox.wait_pending()

    async def finished(self, tenant: str, job_id: str) -> pb.Job:
        """Watch the job to its end; returns the final job."""
        request = pb.WatchJobRequest(job_id=job_id)
        async for event in self.stub.WatchJob(request, metadata=self.auth(tenant)):
            if event.WhichOneof("event") == "job_finished":
                return event.job_finished.job
        raise AssertionError(f"{job_id}: the stream ended without JobFinished")

    async def until_done(self, tenant: str, job_id: str, count: int) -> None:
        """Watch the job until `count` of its nodes have finished their calls."""
        done = 0
        request = pb.WatchJobRequest(job_id=job_id)
        async for event in self.stub.WatchJob(request, metadata=self.auth(tenant)):
            change = event.node_state_changed
            if event.WhichOneof("event") == "node_state_changed" and change.node.state in DONE:
                done += 1
                if done == count:
                    return
        raise AssertionError(f"{job_id}: ended with {done} of {count} nodes done")

    async def run(self, tenant: str, spec: pb.JobSpec) -> pb.Job:
        return await self.finished(tenant, (await self.submit(tenant, spec)).job_id)

    async def usage(self, tenant: str) -> admin_pb2.Usage:
        request = admin_pb2.GetUsageRequest(tenant_id=tenant)
        return await self.admin.GetUsage(request, metadata=self.admin_auth)

    async def unharmed(self) -> None:
        """Serving, a bystander's job succeeds, and no tenant holds or lost a reservation."""
        await self.serving()
        await self.gateway.dispatcher.outbox.wait_drained()
        for tenant, job_ids in self.jobs.items():
            await self.settled_as_finished(tenant, job_ids)

    async def serving(self) -> None:
        """Health answers SERVING within a second and a bystander's job succeeds."""
        await self.healthy()
        if BYSTANDER not in self.keys:
            await self.tenant(BYSTANDER)
        with anyio.fail_after(30):
            job = await self.run(BYSTANDER, roots(2))
        assert job.state == pb.JOB_STATE_SUCCEEDED

    async def healthy(self) -> None:
        with anyio.fail_after(1):
            reply = await self.health.Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    async def settled_as_finished(self, tenant: str, job_ids: list[str]) -> None:
        prompt = output = calls = 0
        for job_id in job_ids:
            job = await self.stub.GetJob(
                pb.GetJobRequest(job_id=job_id), metadata=self.auth(tenant)
            )
            assert job.state not in (pb.JOB_STATE_QUEUED, pb.JOB_STATE_RUNNING), job
            # a node cancelled after it took tokens (its tenant's side cancelled it here) is
            # charged those
            done = [n for n in job.nodes if n.state in DONE or _cut_short(n)]
            prompt += sum(n.prompt_tokens for n in done)
            output += sum(n.output_tokens for n in done)
            calls += len(done)
        usage = await self.usage(tenant)
        assert (usage.active_reservations, usage.queued_jobs) == (0, 0), usage
        assert (usage.input_tokens, usage.output_tokens, usage.settled_calls) == (
            prompt,
            output,
            calls,
        ), (tenant, usage, prompt, output, calls)


def _cut_short(node: pb.Node) -> bool:
    return node.state == pb.NODE_STATE_CANCELLED and node.output_tokens > 0


@contextlib.asynccontextmanager
async def reliable_gateway(
    core: LLMEngine | None = None,
    store: QuotaStore | None = None,
    tracer_provider: TracerProvider | None = None,
    store_url: str = "memory",  # a redis URL: the gateway is a replica (it journals its jobs)
    **settings: Any,
) -> AsyncIterator[Reliable]:
    config = Settings(
        **{"policy": "justitia"} | settings,
        port=0,
        admin_key=ADMIN_KEY,
        max_model_len=4096,
        store=store_url,
    )
    async with (
        running_gateway(
            config,
            core=core if core is not None else sim_core(),
            store=store if store is not None else MemoryQuotaStore(),
            tracer_provider=tracer_provider,
        ) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        yield Reliable(
            gateway,
            channel,
            gateway_pb2_grpc.GatewayStub(channel),
            admin_pb2_grpc.AdminStub(channel),
            health_pb2_grpc.HealthStub(channel),
        )
