"""A Gateway servicer for client tests: the real job model, validation, registry, views, quota
store and error edge, with an instant "engine" that answers each call with its rendered prompt.

Calls run to the end inside SubmitJob, streaming the echo word by word, except in jobs named
`hold`, whose ready nodes wait until the job is cancelled. A prompt containing `FAIL` fails its
node. Generate reserves exactly `max_tokens` (default 16) in the quota store, so tests can
predict the store's answer.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.auth import current_tenant
from gateway.errors import grpc_edge
from gateway.job_run import JobRun, NodeState
from gateway.jobs import JobLimits, job_spec_from_proto, validate_job
from gateway.registry import JobRegistry
from gateway.views import event_to_proto, job_to_proto
from tenants import QuotaStore

Context = grpc.aio.ServicerContext[Any, Any]
GENERATE_MAX_TOKENS = 16


class EchoGateway(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, store: QuotaStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.jobs = JobRegistry()
        self._count = 0

    async def _submit(self, msg: pb.JobSpec) -> JobRun:
        tenant_id = current_tenant()
        if msg.idempotency_key and (old := self.jobs.by_key(tenant_id, msg.idempotency_key)):
            return old
        quota = (await self.store.get_tenant(tenant_id)).quota
        spec = job_spec_from_proto(msg)
        validate_job(spec, JobLimits(max_tokens_ceiling=quota.max_tokens_ceiling))
        self._count += 1
        job_id = f"job-{self._count}"
        await self.store.admit_job(tenant_id, job_id, len(spec.nodes))
        run = JobRun(job_id, tenant_id, spec, self.clock())
        self.jobs.add(run)
        ready = run.start(self.clock())
        while ready and spec.name != "hold":
            ready += self._echo(run, ready.pop(0))
        return run

    def _echo(self, run: JobRun, node_id: str) -> list[str]:
        prompt = run.prompt(node_id)
        text = prompt if isinstance(prompt, str) else "\n".join(m.content for m in prompt)
        words = text.split(" ")
        run.mark_running(node_id, len(words), self.clock())
        if "FAIL" in text:
            return run.finish_node(node_id, NodeState.FAILED, self.clock(), "echo refused")
        for i, word in enumerate(words):
            run.add_tokens(node_id, word if i == 0 else f" {word}", (i,), self.clock())
        return run.finish_node(node_id, NodeState.SUCCEEDED, self.clock())

    @grpc_edge
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Context) -> pb.Job:
        return job_to_proto(await self._submit(request.job))

    @grpc_edge
    async def GetJob(self, request: pb.GetJobRequest, context: Context) -> pb.Job:
        return job_to_proto(self.jobs.get(current_tenant(), request.job_id))

    @grpc_edge
    async def CancelJob(self, request: pb.CancelJobRequest, context: Context) -> pb.Job:
        run = self.jobs.get(current_tenant(), request.job_id)
        run.cancel(self.clock(), "cancelled by the client")
        return job_to_proto(run)

    @grpc_edge
    async def WatchJob(
        self, request: pb.WatchJobRequest, context: Context
    ) -> AsyncIterator[pb.JobEvent]:
        run = self.jobs.get(current_tenant(), request.job_id)
        async for event in run.watch(max(request.from_sequence - 1, 0)):
            yield event_to_proto(run, event)

    @grpc_edge
    async def RunJob(
        self, request: pb.SubmitJobRequest, context: Context
    ) -> AsyncIterator[pb.JobEvent]:
        run = await self._submit(request.job)
        async for event in run.watch():
            yield event_to_proto(run, event)

    @grpc_edge
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        tenant_id = current_tenant()
        self._count += 1
        call_id = f"generate-{self._count}"
        max_tokens = request.sampling.max_tokens or GENERATE_MAX_TOKENS
        await self.store.reserve(tenant_id, call_id, max_tokens, ttl_s=60.0)
        words = request.prompt.split(" ")[:max_tokens]
        for i, word in enumerate(words):
            yield pb.GenerateResponse(text=word if i == 0 else f" {word}", token_ids=[i])
        await self.store.settle(tenant_id, call_id, len(words), len(words))
        usage = pb.TokenUsage(prompt_tokens=len(words), output_tokens=len(words))
        yield pb.GenerateResponse(finish_reason=pb.FINISH_REASON_STOP, usage=usage)
