"""A job whose journal record cannot be read, through a replica's gRPC service: GetJob,
WatchJob, CancelJob and a SubmitJob with its idempotency key answer DATA_LOSS naming the job
(they answered INTERNAL "internal error", each with a traceback in the log), and a watcher
following it from before its record became unreadable sees it end FAILED once a replica claims
it (it waited for ever: every claim failed, and the job never ended)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2
from grpc_status import rpc_status

from fairgate.v1 import gateway_pb2 as pb
from gateway.gateway_protos import job_spec_from_proto
from gateway.job_run import JobRun
from gateway.journal import Batch, RedisJournal
from tenants import RedisQuotaStore
from tests.gateway.conftest import sim_core
from tests.reliability.harness import Reliable, reliable_gateway
from tests.reliability.redis_server import RedisServer
from tests.reliability.test_redis_outage import chain

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
KEY = "order-1"


@contextlib.asynccontextmanager
async def replica_and_gone_job(
    redis: RedisServer, tmp_path: Path
) -> AsyncIterator[tuple[Reliable, RedisJournal, str]]:
    """A replica whose lease ticks are a minute apart (the test claims by hand), and a job of
    its tenant, its first node ready (event 1), journaled by a replica that is gone, its lease
    still running (so the replica answers for it from the journal and does not take it over);
    the gone replica's journal is the test's raw access to Redis."""
    async with reliable_gateway(
        core=sim_core(0.01),
        store=RedisQuotaStore(redis.url),
        store_url=redis.url,
        replica_id="b",
        lease_ttl_s=60.0,
        grace_s=0.1,
        outbox_file=tmp_path / "outbox-b.jsonl",
    ) as b:
        await b.tenant("t1")
        gone = RedisJournal(redis.url, "gone", lease_ttl_s=60.0)
        spec = chain(2)
        spec.idempotency_key = KEY
        run = JobRun("job-0123456789abcdef", "t1", job_spec_from_proto(spec), time.time())
        try:
            owned = await gone.create(run)
            run.start(time.time())
            assert await gone.append([Batch(owned, run.events)]) == [True]
            yield b, gone, run.job_id
        finally:
            await gone.aclose()


def refusal(err: grpc.aio.AioRpcError) -> tuple[int, str, str]:
    """Its status code, ErrorInfo reason ('' for none) and message."""
    status = rpc_status.from_call(err)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    if status.details:
        status.details[0].Unpack(info)
    return status.code, info.reason, status.message


async def test_reads_of_an_unreadable_job_answer_data_loss(
    redis: RedisServer, tmp_path: Path
) -> None:
    async with replica_and_gone_job(redis, tmp_path) as (b, gone, job_id):
        await gone._redis.hset(gone._job("t1", job_id), "spec", "!!not base64")
        auth = b.auth("t1")
        spec = chain(2)
        spec.idempotency_key = KEY
        calls = {
            "GetJob": lambda: b.stub.GetJob(pb.GetJobRequest(job_id=job_id), metadata=auth),
            "CancelJob": lambda: b.stub.CancelJob(
                pb.CancelJobRequest(job_id=job_id), metadata=auth
            ),
            "SubmitJob": lambda: b.stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=auth),
        }
        for name, call in calls.items():
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call()
            code, reason, message = refusal(refused.value)
            assert (name, code, reason) == (name, code_pb2.DATA_LOSS, "JOB_UNREADABLE")
            assert job_id in message
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in b.stub.WatchJob(pb.WatchJobRequest(job_id=job_id), metadata=auth):
                pass
        assert refusal(refused.value)[:2] == (code_pb2.DATA_LOSS, "JOB_UNREADABLE")
        await b.serving()


async def test_a_watcher_sees_a_job_whose_record_became_unreadable_end_failed(
    redis: RedisServer, tmp_path: Path
) -> None:
    """The replica answering the watch decoded the job's spec before it was corrupted (it
    keeps it: a spec never changes), so the watch reads on; the replica that claims the job
    cannot read it and ends it."""
    async with replica_and_gone_job(redis, tmp_path) as (b, gone, job_id):
        seen: list[pb.JobEvent] = []
        following = anyio.Event()

        async def watch() -> None:
            request = pb.WatchJobRequest(job_id=job_id)
            async for event in b.stub.WatchJob(request, metadata=b.auth("t1")):
                seen.append(event)
                following.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await following.wait()  # event 1 seen: the watch waits for the next
                key = gone._job("t1", job_id)
                await gone._redis.hset(key, mapping={"spec": "!!not base64", "lease_until": 0})
                claimer = RedisJournal(redis.url, "c", lease_ttl_s=60.0)
                try:
                    assert await claimer.claim("t1", job_id) is None  # ended, not taken over
                finally:
                    await claimer.aclose()
        assert [event.sequence for event in seen] == [1, 2]
        assert seen[-1].job_finished.job.state == pb.JOB_STATE_FAILED
