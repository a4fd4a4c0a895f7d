"""Memory stays bounded under a tenant's churn: the render bomb and 10,000 ended jobs of one
tenant grow the gateway's resident memory by at most 256 MB over its own baseline, and another
tenant's jobs are still readable. The server runs in this process, so what is measured is the
whole test process's RSS (an upper bound on the gateway's own)."""

from __future__ import annotations

import os

import anyio
import grpc
import pytest

from fairgate.v1 import gateway_pb2 as pb
from tests.reliability.harness import node, reliable_gateway, roots

pytestmark = pytest.mark.anyio
JOBS = 10_000
CONCURRENCY = 32
LIMIT_BYTES = 256 << 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_the_render_bomb_and_ten_thousand_ended_jobs_stay_within_256_mb() -> None:
    async with reliable_gateway() as h:
        await h.tenant("quiet")
        await h.tenant("churn", max_queued_jobs=CONCURRENCY)
        kept = await h.run("quiet", roots(2))
        for _ in range(200):  # warm up: the code paths and the allocator's arenas
            await h.run("churn", roots(1, 4))
        baseline = rss_bytes()
        bomb = pb.JobSpec(nodes=[node("bomb", "{{inputs.x}}" * 400)], inputs={"x": "y" * 125_000})
        with pytest.raises(grpc.aio.AioRpcError):
            await h.submit("churn", bomb)

        request = pb.SubmitJobRequest(job=roots(1, 4))

        async def churn(count: int) -> None:
            for _ in range(count):
                async for _ in h.stub.RunJob(request, metadata=h.auth("churn")):
                    pass

        async with anyio.create_task_group() as tg:
            for _ in range(CONCURRENCY):
                tg.start_soon(churn, JOBS // CONCURRENCY)
        grown = rss_bytes() - baseline
        print(f"RSS grew by {grown / 2**20:.1f} MB over {JOBS} ended jobs and the render bomb")
        assert grown <= LIMIT_BYTES
        get = pb.GetJobRequest(job_id=kept.job_id)
        assert (await h.stub.GetJob(get, metadata=h.auth("quiet"))).job_id == kept.job_id
        del h.jobs["churn"]  # most were forgotten: their usage is checked by the churn test
        await h.unharmed()
