"""A lone replica (a real `fairgate serve` process, redis store) stopped with SIGTERM while its
jobs run, then started again: the jobs go on and finish (no cancel at shutdown), a RunJob client
whose stream broke resumes with WatchJob from its last sequence and sees every event once, and
usage equals the settled calls, with no reservation or admitted job left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import grpc
import pytest

from fairgate.v1 import admin_pb2, admin_pb2_grpc, gateway_pb2_grpc
from fairgate.v1 import gateway_pb2 as pb
from tests.gateway.conftest import ADMIN_KEY
from tests.integration.processes import free_port
from tests.reliability.redis_server import RedisServer
from tests.reliability.test_redis_outage import chain

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
DONE = (pb.NODE_STATE_SUCCEEDED, pb.NODE_STATE_CAPPED)


@contextmanager
def gateway_process(
    redis: RedisServer, port: int, tmp_path: Path
) -> Iterator[subprocess.Popen[str]]:
    env = os.environ | {
        "FAIRGATE_STORE": redis.url,
        "FAIRGATE_ADMIN_KEY": ADMIN_KEY,
        "FAIRGATE_SIMULATED_ENGINE": "true",
        "FAIRGATE_SIMULATED_STEP_S": "0.02",
        "FAIRGATE_REPLICA_ID": "lone",
        "FAIRGATE_LEASE_TTL_S": "1.5",
        "FAIRGATE_GRACE_S": "0.2",
        "FAIRGATE_OUTBOX_FILE": str(tmp_path / "outbox.jsonl"),
    }
    command = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:  # its first line says it serves
        if line.startswith("fairgate serving on"):
            break
    else:
        raise AssertionError(f"the gateway exited with {process.wait()}")
    # its later lines are read and dropped, so a full pipe never blocks it
    drain = threading.Thread(target=process.stdout.read, daemon=True)
    drain.start()
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        drain.join()
        process.stdout.close()


async def test_sigterm_then_restart_finishes_every_job(redis: RedisServer, tmp_path: Path) -> None:
    port = free_port()
    admin_auth = (("authorization", f"Bearer {ADMIN_KEY}"),)
    with gateway_process(redis, port, tmp_path) as first:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            await admin.CreateTenant(
                admin_pb2.CreateTenantRequest(tenant_id="t1"), metadata=admin_auth
            )
            issued = await admin.IssueKey(
                admin_pb2.IssueKeyRequest(tenant_id="t1"), metadata=admin_auth
            )
            auth = (("authorization", f"Bearer {issued.plaintext}"),)
            stub = gateway_pb2_grpc.GatewayStub(channel)
            job_ids = []
            for _ in range(3):
                job = await stub.SubmitJob(pb.SubmitJobRequest(job=chain(3, 32)), metadata=auth)
                job_ids.append(job.job_id)
            streamed: list[pb.JobEvent] = []
            # long enough that a client reading behind the stream still sees it break
            run = stub.RunJob(pb.SubmitJobRequest(job=chain(4, 64)), metadata=auth)
            while True:  # until its first node is done (breaking an `async for` cancels it)
                event = await run.read()
                assert isinstance(event, pb.JobEvent)
                streamed.append(event)
                change = event.node_state_changed
                if event.WhichOneof("event") == "node_state_changed" and change.node.state in DONE:
                    break
            first.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.aio.AioRpcError):  # the stream breaks: the job goes on
                while (event := await run.read()) is not grpc.aio.EOF:
                    assert isinstance(event, pb.JobEvent)
                    streamed.append(event)
            assert first.wait(timeout=30) == 0
    job_ids.append(streamed[0].job_id)
    with gateway_process(redis, port, tmp_path):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            resume = pb.WatchJobRequest(job_id=job_ids[-1], from_sequence=streamed[-1].sequence + 1)
            with anyio.fail_after(60):
                async for event in stub.WatchJob(resume, metadata=auth):
                    streamed.append(event)
                jobs = [
                    await stub.GetJob(pb.GetJobRequest(job_id=j), metadata=auth) for j in job_ids
                ]
                for job in jobs:
                    assert job.state in (pb.JOB_STATE_RUNNING, pb.JOB_STATE_SUCCEEDED)
                jobs = []
                for job_id in job_ids:
                    async for event in stub.WatchJob(
                        pb.WatchJobRequest(job_id=job_id), metadata=auth
                    ):
                        if event.WhichOneof("event") == "job_finished":
                            jobs.append(event.job_finished.job)
            assert [job.state for job in jobs] == [pb.JOB_STATE_SUCCEEDED] * len(job_ids)
            assert [e.sequence for e in streamed] == list(range(1, len(streamed) + 1))
            assert streamed[-1].WhichOneof("event") == "job_finished"
            admin = admin_pb2_grpc.AdminStub(channel)
            usage = await admin.GetUsage(
                admin_pb2.GetUsageRequest(tenant_id="t1"), metadata=admin_auth
            )
    finished = [n for job in jobs for n in job.nodes if n.state in DONE]
    assert (usage.active_reservations, usage.queued_jobs) == (0, 0), usage
    assert usage.settled_calls == len(finished)
    assert usage.input_tokens == sum(n.prompt_tokens for n in finished)
    assert usage.output_tokens == sum(n.output_tokens for n in finished)
