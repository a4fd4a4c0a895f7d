"""A harness gateway kept busy: tenants whose long calls are streaming while a test looks."""

from __future__ import annotations

import anyio

from fairgate.v1 import gateway_pb2 as pb
from tests.gateway.conftest import Harness

LONG = 2000  # tokens: with 10 ms steps the calls run for 20 s, far past the test


def roots(count: int, max_tokens: int) -> pb.JobSpec:
    sampling = pb.SamplingSpec(max_tokens=max_tokens)
    nodes = (
        pb.NodeSpec(id=f"n{i}", prompt_template=f"say {i}", sampling=sampling) for i in range(count)
    )
    return pb.JobSpec(nodes=nodes)


async def submit(h: Harness, tenant: str, spec: pb.JobSpec) -> str:
    job = await h.stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=h.auth(tenant))
    return job.job_id


async def until_streaming(h: Harness, tenant: str, job_id: str, count: int) -> None:
    """Watch the job until `count` of its nodes have streamed tokens."""
    streaming: set[str] = set()
    request = pb.WatchJobRequest(job_id=job_id)
    async for event in h.stub.WatchJob(request, metadata=h.auth(tenant)):
        if event.WhichOneof("event") == "token_delta":
            streaming.add(event.token_delta.node_id)
            if len(streaming) == count:
                return
    raise AssertionError(f"{job_id}: ended with {len(streaming)} of {count} nodes streaming")


async def two_tenants_running(h: Harness) -> None:
    """alpha (weight 2) has run a short job and runs two long calls; beta runs two."""
    with anyio.fail_after(10):
        short = pb.WatchJobRequest(job_id=await submit(h, "alpha", roots(1, 4)))
        async for event in h.stub.WatchJob(short, metadata=h.auth("alpha")):
            if event.WhichOneof("event") == "job_finished":
                break
        for tenant in ("alpha", "beta"):
            await until_streaming(h, tenant, await submit(h, tenant, roots(2, LONG)), 2)
