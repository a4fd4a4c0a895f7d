"""The `fairgate.v1.Gateway` servicer: thin handlers that translate and delegate.

SubmitJob validates the DAG against the tenant's limits, admits it against the tenant's
quotas and hands it to the dispatcher; the same idempotency key returns the same job. RunJob and
Generate cancel their job when the client goes away; WatchJob only stops watching.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import grpc
from cachetools import TTLCache

from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.auth import current_tenant
from gateway.dispatch import Dispatcher
from gateway.errors import grpc_edge
from gateway.job_run import JobEnded, JobRun, TokensAdded
from gateway.jobs import JobLimits, JobSpec, NodeSpec, job_spec_from_proto, validate_job
from gateway.jobs.convert import chat_from_proto, sampling_from_proto
from gateway.registry import JobRegistry
from gateway.views import event_to_proto, finish_reason, job_to_proto, usage
from tenants import QuotaStore, TenantQuota

Context = grpc.aio.ServicerContext[Any, Any]


def limits_for(quota: TenantQuota) -> JobLimits:
    return JobLimits(
        max_nodes=quota.max_nodes_per_job or JobLimits().max_nodes,
        max_tokens_ceiling=quota.max_tokens_ceiling,
    )


class GatewayService(gateway_pb2_grpc.GatewayServicer):
    def __init__(
        self,
        jobs: JobRegistry,
        dispatcher: Dispatcher,
        store: QuotaStore,
        clock: Callable[[], float] = time.time,
        quota_ttl_s: float = 1.0,
    ) -> None:
        self.jobs = jobs
        self.dispatcher = dispatcher
        self.store = store
        self.clock = clock
        self._submit_lock = anyio.Lock()  # idempotency keys: check-and-add is one step
        # tenant -> quota: an operator's change reaches new jobs within quota_ttl_s
        self._quotas: TTLCache[str, TenantQuota] = TTLCache(maxsize=65_536, ttl=quota_ttl_s)

    async def submit(self, tenant_id: str, spec: JobSpec) -> JobRun:
        if not spec.idempotency_key:
            return await self._admit(tenant_id, spec)
        async with self._submit_lock:
            existing = self.jobs.by_key(tenant_id, spec.idempotency_key)
            return existing if existing is not None else await self._admit(tenant_id, spec)

    async def _admit(self, tenant_id: str, spec: JobSpec) -> JobRun:
        quota = self._quotas.get(tenant_id)
        if quota is None:
            quota = self._quotas[tenant_id] = (await self.store.get_tenant(tenant_id)).quota
        validate_job(spec, limits_for(quota))
        run = JobRun(f"job-{uuid.uuid4().hex[:16]}", tenant_id, spec, self.clock())
        admitted = await self.dispatcher.admit(run, quota)
        self.jobs.add(run)
        self.dispatcher.submit(run, quota, admitted)
        return run

    @grpc_edge
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Context) -> pb.Job:
        run = await self.submit(current_tenant(), job_spec_from_proto(request.job))
        return job_to_proto(run)

    @grpc_edge
    async def GetJob(self, request: pb.GetJobRequest, context: Context) -> pb.Job:
        return job_to_proto(self.jobs.get(current_tenant(), request.job_id))

    @grpc_edge
    async def CancelJob(self, request: pb.CancelJobRequest, context: Context) -> pb.Job:
        run = self.jobs.get(current_tenant(), request.job_id)
        if not run.ended:
            self.dispatcher.cancel(run, "cancelled by the client")
        return job_to_proto(run)

    @grpc_edge
    async def WatchJob(
        self, request: pb.WatchJobRequest, context: Context
    ) -> AsyncIterator[pb.JobEvent]:
        run = self.jobs.get(current_tenant(), request.job_id)
        # from_sequence names the first event wanted; watch() takes the last one seen
        async for event in run.watch(max(request.from_sequence - 1, 0)):
            yield event_to_proto(run, event)

    @grpc_edge
    async def RunJob(
        self, request: pb.SubmitJobRequest, context: Context
    ) -> AsyncIterator[pb.JobEvent]:
        run = await self.submit(current_tenant(), job_spec_from_proto(request.job))
        try:
            async for event in run.watch():
                yield event_to_proto(run, event)
        finally:
            if not run.ended:  # the client went away
                self.dispatcher.cancel(run, "client disconnected")

    @grpc_edge
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        run = await self.submit(current_tenant(), _single_call(request))
        try:
            # One response per wake-up: the tokens that came meanwhile, with the end if it came
            async for batch in run.watch_batches():
                response = pb.GenerateResponse()
                for event in batch:
                    if isinstance(event.body, TokensAdded):
                        response.text += event.body.text
                        response.token_ids.extend(event.body.token_ids)
                    elif isinstance(event.body, JobEnded):
                        node = run.nodes["generate"]
                        response.finish_reason = finish_reason(node)
                        response.usage.CopyFrom(usage([node]))
                if response.token_ids or response.text or response.HasField("usage"):
                    yield response
        finally:
            if not run.ended:
                self.dispatcher.cancel(run, "client disconnected")


def _single_call(request: pb.GenerateRequest) -> JobSpec:
    """A one-node job for Generate; a plain prompt travels as an input, so it stays literal."""
    sampling = sampling_from_proto(request.sampling)
    if request.WhichOneof("input") == "chat":
        messages = chat_from_proto(request.chat)
        node = NodeSpec(id="generate", messages=messages, sampling=sampling, name=request.name)
        return JobSpec(nodes=(node,), name="generate")
    template = "{{inputs.prompt}}"
    node = NodeSpec(id="generate", prompt_template=template, sampling=sampling, name=request.name)
    return JobSpec(nodes=(node,), inputs={"prompt": request.prompt}, name="generate")
