"""Redis goes away mid-run (killed and restarted; frozen past a reserve's deadline): new work is
refused with UNAVAILABLE + RetryInfo, running calls go on, every accepted job finishes, and the
usage Redis keeps equals the settled calls exactly: nothing free, nothing charged twice."""

from __future__ import annotations

from pathlib import Path

import anyio
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fairgate.v1 import gateway_pb2 as pb
from tenants import RedisQuotaStore
from tests.gateway.conftest import sim_core
from tests.reliability.harness import Reliable, node, reliable_gateway, roots
from tests.reliability.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
TENANTS = ("t1", "t2", "t3")


def chain(length: int = 3, max_tokens: int = 40) -> pb.JobSpec:
    nodes = [node("n0", "start", max_tokens)]
    for i in range(1, length):
        nodes.append(node(f"n{i}", f"go on from {{{{n{i - 1}.output}}}}", max_tokens, f"n{i - 1}"))
    return pb.JobSpec(nodes=nodes)


async def start_jobs(h: Reliable) -> list[tuple[str, str]]:
    for tenant in TENANTS:
        await h.tenant(tenant)
    await h.run("t1", roots(1))  # loads every script, admit_job_and_reserve's included
    accepted = []
    for _ in range(2):
        for tenant in TENANTS:
            accepted.append((tenant, (await h.submit(tenant, chain())).job_id))
    return accepted


async def assert_refused_while_away(h: Reliable) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await h.submit("t1", roots(1))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    status = rpc_status.from_call(refused.value)
    assert status is not None
    assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)
    assert "127.0.0.1" not in refused.value.details()  # nothing of the server leaks


async def test_redis_killed_and_restarted_mid_run(redis: RedisServer, tmp_path: Path) -> None:
    store = RedisQuotaStore(redis.url, socket_timeout_s=0.25)
    settings = {"outbox_file": tmp_path / "outbox.jsonl"}
    async with reliable_gateway(core=sim_core(0.005), store=store, **settings) as h:
        accepted = await start_jobs(h)
        redis.kill()
        await assert_refused_while_away(h)
        await h.healthy()  # running calls go on
        await h.outbox_used()  # a call finished meanwhile: its settle waits in the outbox
        redis.start()
        with anyio.fail_after(30):
            jobs = [await h.finished(tenant, job_id) for tenant, job_id in accepted]
        assert {job.state for job in jobs} == {pb.JOB_STATE_SUCCEEDED}
        await h.unharmed()


async def test_redis_frozen_past_the_reserve_deadline(redis: RedisServer, tmp_path: Path) -> None:
    store = RedisQuotaStore(redis.url, socket_timeout_s=0.25)
    settings = {"outbox_file": tmp_path / "outbox.jsonl", "reserve_deadline_s": 1.0}
    async with reliable_gateway(core=sim_core(0.005), store=store, **settings) as h:
        accepted = await start_jobs(h)
        redis.freeze()
        await assert_refused_while_away(h)
        await h.healthy()
        await h.outbox_used()
        await anyio.sleep(1.5)  # past the reserve deadline: calls that needed one fail
        redis.thaw()
        with anyio.fail_after(30):
            jobs = [await h.finished(tenant, job_id) for tenant, job_id in accepted]
        assert {job.state for job in jobs} <= {pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED}
        reasons = {n.reason for job in jobs for n in job.nodes if n.state == pb.NODE_STATE_FAILED}
        assert reasons <= {"quota store unavailable", "parent 'n0' failed", "parent 'n1' failed"}
        await h.unharmed()  # the refused admissions' late scripts were undone too
