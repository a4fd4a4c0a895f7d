"""A gateway before two `fairgate engine serve` processes running the real default model.

The map-reduce job of the examples runs on the pool and succeeds, its calls spread over both
servers as the router sees their load, and the quota settles what the servers generated.
"""

from __future__ import annotations

import anyio
import pytest

from bench.engine_servers import engine_servers, server_metric
from engine.loader import DEFAULT_MODEL, resolve_model, served_model_name
from fairgate.v1 import gateway_pb2 as pb
from gateway.backends.settings import BackendSettings
from tests.reliability.harness import node, reliable_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.timeout(600)]


def map_reduce(topic: str) -> pb.JobSpec:
    maps = [node(f"m{i}", f"Give one fact about {topic} number {i}.", 24) for i in range(3)]
    inputs = " ".join(f"{{{{m{i}.output}}}}" for i in range(3))
    return pb.JobSpec(nodes=[*maps, node("r", f"Summarise: {inputs}", 32, "m0", "m1", "m2")])


async def test_map_reduce_jobs_run_on_a_pool_of_two_real_engines() -> None:
    model = served_model_name(DEFAULT_MODEL)
    flags = ["--served-model-name", model, "--num-threads", "1"]
    async with engine_servers(2, flags) as servers:
        tables = [
            BackendSettings(
                kind="openai",
                name=s.name,
                url=s.url,
                model=model,
                tokenizer=resolve_model(DEFAULT_MODEL),
                max_num_seqs=64,
                # a snapshot is stale after five intervals: on a busy 2-core machine a server
                # stepping the real model can take longer than 0.5 s to answer /metrics, and a
                # stale server is sent nothing
                scrape_interval_s=0.5,
            )
            for s in servers
        ]
        async with reliable_gateway(backends=tables) as h:
            await h.tenant("t")
            async with anyio.create_task_group() as tg:
                for topic in ("rivers", "stars"):
                    tg.start_soon(h.run, "t", map_reduce(topic))
            for job_id in h.jobs["t"]:
                assert (await h.finished("t", job_id)).state == pb.JOB_STATE_SUCCEEDED
            generated = [
                await server_metric(s.url, "vllm:generation_tokens_total") for s in servers
            ]
            # each job's calls went to one of the two
            assert all(g > 0 for g in generated), generated
            await h.unharmed()
            usage = await h.usage("t")
            bystander = await h.usage("bystander")
            total = [await server_metric(s.url, "vllm:generation_tokens_total") for s in servers]
            assert sum(total) == usage.output_tokens + bystander.output_tokens
