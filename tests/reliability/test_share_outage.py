"""The pool's share fails closed: a replica whose Redis froze sends no new call to its shared
backend (the call's grant cannot be had), the call fails once the reserve deadline passes, and
when Redis returns the job ends with it failed, what ran settled and nothing held. Whatever the
policy: every one orders a shared pool through the grant."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from bench.engine_servers import server_metric
from fairgate.v1 import gateway_pb2 as pb
from gateway.job_run import JobRun, NodeState
from tenants import RedisQuotaStore
from tests.gateway.engine_servers import backend_of, engine_servers
from tests.reliability.harness import reliable_gateway
from tests.reliability.redis_server import RedisServer
from tests.reliability.test_redis_outage import chain

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


async def until(run: JobRun, check: Callable[[], bool]) -> None:
    """Return once `check()` holds of the job as this replica runs it, looked at as it changes:
    `watch` wakes at each of its events, journaled or not yet (Redis may be frozen), and stops
    once `check()` holds (or the job has ended)."""
    async for _ in run.watch_batches(run.last_sequence, stop=check):
        pass
    assert check(), run.nodes


@pytest.mark.parametrize("policy", ["justitia", "fcfs", "las"])
async def test_no_call_is_sent_without_the_pool_s_share(
    redis: RedisServer, tmp_path: Path, policy: str
) -> None:
    async with (
        engine_servers(tmp_path, 1, step_s=0.01) as (server,),
        reliable_gateway(
            store=RedisQuotaStore(redis.url, socket_timeout_s=0.25),
            store_url=redis.url,
            backends=[backend_of(server, tmp_path)],
            replica_id="a",
            outbox_file=tmp_path / "outbox.jsonl",
            reserve_deadline_s=1.0,
            policy=policy,
        ) as h,
    ):
        exchange = h.gateway.dispatcher.exchange
        assert exchange is not None and exchange.share.policy == policy  # every call granted
        await h.tenant("t1")
        job = await h.submit("t1", chain(2, 100))  # its first call runs for about a second
        dispatcher = h.gateway.dispatcher
        run = dispatcher.runs[job.job_id]
        with anyio.fail_after(10):
            await until(run, lambda: run.nodes["n0"].state is NodeState.RUNNING)
        assert dispatcher.core.running
        redis.freeze()
        with anyio.fail_after(20):  # the first call ends, the second cannot be granted
            await until(run, lambda: run.nodes["n1"].state is NodeState.FAILED)
        assert run.nodes["n0"].state is NodeState.SUCCEEDED
        assert run.nodes["n1"].reason == "fair-share store unavailable"
        prompt = run.nodes["n0"].prompt_tokens
        assert await server_metric(server.url, "vllm:prompt_tokens_total") == prompt  # n0 only
        redis.thaw()
        with anyio.fail_after(20):
            final = await h.finished("t1", job.job_id)
        assert final.state == pb.JOB_STATE_FAILED
        await h.unharmed()
