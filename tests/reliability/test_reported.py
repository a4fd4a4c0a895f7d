"""The five reports that took the whole gateway down or held it hostage, exactly as written."""

from __future__ import annotations

import itertools
import sys

import anyio
import grpc
import pytest

from fairgate.v1 import gateway_pb2 as pb
from gateway.server import UnsafeSettings, running_gateway
from gateway.settings import Settings
from tests.gateway.conftest import sim_core
from tests.reliability.harness import DONE, node, reliable_gateway, roots

pytestmark = pytest.mark.anyio


async def test_one_concurrent_call_and_three_roots_run_one_at_a_time() -> None:
    async with reliable_gateway() as h:
        await h.tenant("narrow", max_concurrent_calls=1)
        job = await h.run("narrow", roots(3, 16))
        assert job.state == pb.JOB_STATE_SUCCEEDED
        starts = sorted(
            (n.start_time.ToNanoseconds(), n.finish_time.ToNanoseconds()) for n in job.nodes
        )
        assert all(finish <= start for (_, finish), (start, _) in itertools.pairwise(starts))
        await h.unharmed()


async def test_a_token_rate_smaller_than_the_job_waits_instead_of_crashing() -> None:
    async with reliable_gateway() as h:
        await h.tenant("slow", tokens_per_minute=200)
        submitted = await h.submit("slow", roots(6, 32))  # each reserves its prompt + 32
        with anyio.fail_after(10):
            await h.until_done("slow", submitted.job_id, 3)  # 200 tokens: 3 calls at first
        await h.serving()  # while "slow" waits for its bucket
        request = pb.GetJobRequest(job_id=submitted.job_id)
        job = await h.stub.GetJob(request, metadata=h.auth("slow"))
        assert sum(n.state in DONE for n in job.nodes) < 6  # the bucket holds the rest back
        await h.stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id), metadata=h.auth("slow"))
        await h.unharmed()


async def test_a_wide_job_cancelled_at_once() -> None:
    async with reliable_gateway() as h:
        await h.tenant("hasty")
        for _ in range(5):
            job = await h.submit("hasty", roots(64))
            await h.stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id), metadata=h.auth("hasty"))
        await h.unharmed()


async def test_a_render_bomb_is_refused_before_rendering() -> None:
    async with reliable_gateway() as h:
        await h.tenant("bomber")
        encoder = h.gateway.dispatcher.encoder()
        cached = encoder.cache_bytes
        spec = pb.JobSpec(nodes=[node("bomb", "{{inputs.x}}" * 400)], inputs={"x": "y" * 125_000})
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.submit("bomber", spec)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "nodes[0]" in refused.value.details() and "262,144" in refused.value.details()
        assert encoder.cache_bytes == cached
        await h.unharmed()


async def test_serving_off_loopback_with_the_default_admin_key_is_refused() -> None:
    with pytest.raises(UnsafeSettings, match="default admin key"):
        async with running_gateway(Settings(host="0.0.0.0", port=0), core=sim_core()):
            pass
    command = [sys.executable, "-m", "gateway.cli", "serve", "--host", "0.0.0.0", "--port", "0"]
    done = await anyio.run_process(command, check=False)
    assert done.returncode == 2 and b"default admin key" in done.stderr


async def test_a_child_refused_as_it_becomes_ready_fails_its_job_only() -> None:
    async with reliable_gateway() as h:
        await h.tenant("acme", max_prompt_tokens=1000)
        spec = pb.JobSpec(
            nodes=[node("a", "hi"), node("b", "{{inputs.doc}} {{a.output}}", 8, "a")],
            inputs={"doc": "x" * 100_000},
        )
        job = await h.run("acme", spec)
        assert job.state == pb.JOB_STATE_FAILED
        assert "exceeds the limit" in {n.id: n for n in job.nodes}["b"].reason
        await h.unharmed()


async def test_cancels_racing_the_last_call_of_a_job() -> None:
    async with reliable_gateway() as h:
        await h.tenant("hasty")
        for _ in range(300):
            job = await h.submit("hasty", roots(1, 1))
            await h.stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id), metadata=h.auth("hasty"))
        await h.unharmed()


async def test_generate_chat_text_stays_literal() -> None:
    async with reliable_gateway() as h:
        await h.tenant("acme")
        chat = pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content="say {{ x }}")])
        request = pb.GenerateRequest(chat=chat, sampling=pb.SamplingSpec(max_tokens=4))
        responses = [r async for r in h.stub.Generate(request, metadata=h.auth("acme"))]
        assert sum(len(r.token_ids) for r in responses) == 4
        await h.unharmed()
