"""A gateway in front of a pool of two `fairgate engine serve` processes (the `openai` backend).

Real processes, real HTTP, real gRPC: jobs run on both servers and succeed; a cancel reaches the
server (its running count drops to 0) and releases the quota; a server killed mid-job has its
calls run again on the other by the lost-call rule, which the job's stream shows.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from transformers import AutoTokenizer

from bench.engine_servers import server_metric
from fairgate.v1 import gateway_pb2 as pb
from gateway.backends.openai import OpenAIBackend
from tests.gateway.engine_servers import backend_of, engine_servers
from tests.reliability.harness import Reliable, node, reliable_gateway, reruns

pytestmark = pytest.mark.anyio


def map_reduce(parts: int, max_tokens: int) -> pb.JobSpec:
    maps = [node(f"map{i}", f"summarize part {i}", max_tokens) for i in range(parts)]
    inputs = " ".join(f"{{{{map{i}.output}}}}" for i in range(parts))
    reduce = node("reduce", f"combine: {inputs}", max_tokens, *(f"map{i}" for i in range(parts)))
    return pb.JobSpec(nodes=[*maps, reduce])


async def running_on(h: Reliable, job_id: str, tenant: str) -> tuple[str, str]:
    """The first call of the job to stream a token, and the backend streaming it."""
    request = pb.WatchJobRequest(job_id=job_id)
    async for event in h.stub.WatchJob(request, metadata=h.auth(tenant)):
        if event.WhichOneof("event") == "token_delta":
            call_id = f"{job_id}/{event.token_delta.node_id}"
            entry = h.gateway.dispatcher.core.running.get(call_id)
            if entry is not None:
                return call_id, entry.backend
    raise AssertionError(f"{job_id} ended before a call streamed")


async def test_jobs_of_two_tenants_run_on_both_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[Path] = []  # the gateway's loads of the pool's tokenizer
    load = AutoTokenizer.from_pretrained

    def counted(path: Path, *args: Any, **kwargs: Any) -> Any:
        loads.append(Path(path))
        return load(path, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", counted)
    async with (
        engine_servers(tmp_path, 2, step_s=0.002) as servers,
        reliable_gateway(backends=[backend_of(s, tmp_path) for s in servers]) as h,
    ):
        assert loads.count(tmp_path) == 1  # once for the pool, not once more per server
        for tenant in ("a", "b"):
            await h.tenant(tenant)
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(h.run, "ab"[i % 2], map_reduce(3, 24))
        for tenant, job_ids in h.jobs.items():
            for job_id in job_ids:
                assert (await h.finished(tenant, job_id)).state == pb.JOB_STATE_SUCCEEDED
        for server in servers:  # the pool spread the jobs
            assert await server_metric(server.url, "vllm:generation_tokens_total") > 0
        await h.unharmed()


async def test_a_cancel_reaches_the_server_and_releases_the_quota(tmp_path: Path) -> None:
    async with (
        engine_servers(tmp_path, 2, step_s=0.01) as servers,
        reliable_gateway(backends=[backend_of(s, tmp_path) for s in servers]) as h,
    ):
        await h.tenant("a")
        job = await h.submit("a", map_reduce(4, 500))  # each call would take 5 s
        _, backend = await running_on(h, job.job_id, "a")
        server = next(s for s in servers if s.name == backend)
        running = "vllm:num_requests_running"
        assert await server_metric(server.url, running) > 0
        await h.stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id), metadata=h.auth("a"))
        backends = [h.gateway.dispatcher.backends[s.name] for s in servers]
        with anyio.fail_after(10):
            await h.gateway.dispatcher.wait_calls_closed()  # each call's request closed
            closed_at = time.monotonic()  # the backends' clock
            # the server aborts a call as it sees its client leave, in its own process: its
            # count, scrape by scrape as the gateway reads it (from a scrape sent after every
            # call was closed), is all there is to wait on
            for b in backends:
                assert isinstance(b, OpenAIBackend)
                while b.load is None or b.load.taken_at < closed_at or b.load.running:
                    await b.next_scrape()
        assert not any([await server_metric(s.url, running) for s in servers])
        assert (await h.finished("a", job.job_id)).state == pb.JOB_STATE_CANCELLED
        await h.unharmed()


async def test_a_server_killed_mid_job_has_its_calls_run_again_on_the_other(
    tmp_path: Path,
) -> None:
    async with (
        engine_servers(tmp_path, 2, step_s=0.01) as servers,
        reliable_gateway(backends=[backend_of(s, tmp_path) for s in servers]) as h,
    ):
        await h.tenant("a")
        job = await h.submit("a", map_reduce(4, 150))
        lost, backend = await running_on(h, job.job_id, "a")
        doomed = next(s for s in servers if s.name == backend)
        events = h.stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), metadata=h.auth("a"))
        doomed.kill()
        retried, final = await reruns(events)
        assert final is not None and final.state == pb.JOB_STATE_SUCCEEDED
        lost_node = lost.split("/")[1]
        assert retried.get(lost_node) == "backend lost: running again", retried
        for n in final.nodes:
            assert n.output_tokens == 150 and n.state == pb.NODE_STATE_SUCCEEDED
        await h.unharmed()  # usage: the lost attempts released, the reruns settled


async def test_nodes_run_in_the_pool_of_the_model_they_name(tmp_path: Path) -> None:
    async with (
        engine_servers(tmp_path, 1, step_s=0.002, model="small") as small,
        engine_servers(tmp_path, 1, step_s=0.002, model="large") as large,
    ):
        small[0].name, large[0].name = "small-0", "large-0"
        tables = [backend_of(small[0], tmp_path, "small"), backend_of(large[0], tmp_path, "large")]
        async with reliable_gateway(backends=tables) as h:
            await h.tenant("a")
            draft = node("draft", "write a draft", 12)
            review = node("review", "review: {{draft.output}}", 20, "draft")
            review.model = "large"  # the chain crosses pools: the draft on the default, small
            done = await h.run("a", pb.JobSpec(nodes=[draft, review]))
            assert done.state == pb.JOB_STATE_SUCCEEDED
            generated = "vllm:generation_tokens_total"
            assert await server_metric(small[0].url, generated) == 12
            assert await server_metric(large[0].url, generated) == 20
            bad = pb.JobSpec(nodes=[node("x", "hi", 4)])
            bad.nodes[0].model = "huge"
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await h.submit("a", bad)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "nodes[0].model: unknown model 'huge'" in (refused.value.details() or "")
            await h.unharmed()


async def test_a_call_waiting_for_room_runs_once_a_scrape_shows_it(tmp_path: Path) -> None:
    """Room freed on a remote backend shows only in its next scrape, which wakes no one: the
    call waited for another event, forever when none came."""
    from functools import partial

    import httpx

    from bench.engine_servers import engine_servers as server_processes
    from tests.gateway.engine_servers import MODEL, model_folder

    config = tmp_path / "one-slot.toml"
    config.write_text("max_num_seqs = 1\n")
    flags = ["--simulated", "--simulated-step-s", "0.01", "--model", str(model_folder(tmp_path))]
    flags += ["--served-model-name", MODEL, "--config", str(config)]
    async with server_processes(1, flags) as (server,):
        table = backend_of(server, tmp_path, max_num_seqs=1)
        async with reliable_gateway(backends=[table]) as h, httpx.AsyncClient() as http:
            await h.tenant("a")
            body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 60}
            async with anyio.create_task_group() as tg:  # the server's one slot, taken directly
                tg.start_soon(partial(http.post, f"{server.url}/v1/completions", json=body))
                backend = h.gateway.dispatcher.backends[server.name]
                with anyio.fail_after(20):
                    while backend.capacity().free_slots > 0:  # the gateway has seen it taken
                        await backend.next_scrape()  # type: ignore[attr-defined]
                    done = await h.run("a", pb.JobSpec(nodes=[node("n", "hello", 4)]))
            assert done.state == pb.JOB_STATE_SUCCEEDED


async def test_a_pool_of_short_context_limits_its_own_calls_alone(tmp_path: Path) -> None:
    """Every pool's calls were held to the smallest `max_model_len` of all the pools: a server
    of short context for one model refused the default pool's long prompts, which its engine
    takes."""
    from bench.engine_servers import engine_servers as server_processes
    from gateway.backends.settings import BackendSettings
    from tests.gateway.engine_servers import model_folder

    config = tmp_path / "short.toml"
    config.write_text("max_model_len = 64\n")
    flags = ["--simulated", "--model", str(model_folder(tmp_path)), "--config", str(config)]
    async with server_processes(1, [*flags, "--served-model-name", "short"]) as (server,):
        tables = [BackendSettings(), backend_of(server, tmp_path, "short")]
        async with reliable_gateway(backends=tables) as h:
            await h.tenant("a")
            long_prompt = "a long prompt " * 20  # about 280 tokens: past 64, far below 4096
            done = await h.run("a", pb.JobSpec(nodes=[node("n", long_prompt, 8)]))
            assert done.state == pb.JOB_STATE_SUCCEEDED, done.nodes[0].reason
            short = pb.JobSpec(nodes=[node("s", long_prompt, 8)])
            short.nodes[0].model = "short"
            refused = await h.run("a", short)  # the short pool's own limit still holds
            assert refused.state == pb.JOB_STATE_FAILED
            assert "exceeds the limit of 64" in refused.nodes[0].reason
            await h.unharmed()
