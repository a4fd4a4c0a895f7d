"""What users rely on, and the bounds a tenant cannot push past: idempotency keys, who cancels a
shared job, deadlines, priorities, retention, streams, overload, sampling values and a failing
engine step."""

from __future__ import annotations

import random
import string
import time
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from grpc_health.v1 import health_pb2

from fairgate.v1 import gateway_pb2 as pb
from tenants import RedisQuotaStore
from tests.engine.factories import FlakyRunner
from tests.gateway.conftest import sim_core
from tests.reliability.harness import Reliable, node, reliable_gateway, roots

pytestmark = pytest.mark.anyio


def code_of(err: pytest.ExceptionInfo[grpc.aio.AioRpcError]) -> grpc.StatusCode:
    return err.value.code()


async def test_an_idempotency_key_with_another_body_is_already_exists() -> None:
    async with reliable_gateway() as h:
        await h.tenant("acme")
        spec = roots(2)
        spec.idempotency_key = "once"
        first = await h.submit("acme", spec)
        assert (await h.submit("acme", spec)).job_id == first.job_id
        h.jobs["acme"].pop()
        spec.nodes[0].prompt_template = "something else"
        with pytest.raises(grpc.aio.AioRpcError) as conflict:
            await h.submit("acme", spec)
        assert code_of(conflict) == grpc.StatusCode.ALREADY_EXISTS
        await h.finished("acme", first.job_id)
        await h.unharmed()


async def second_client_leaves(
    first: Reliable, second: Reliable, tenant: str, spec: pb.JobSpec
) -> pb.JobState.ValueType:
    """Two RunJob streams of one job (one idempotency key), the first on `first`, the second
    on `second`: the second closes, and the first reads on. The job's final state."""
    spec.idempotency_key = "shared"
    request = pb.SubmitJobRequest(job=spec)
    reading = first.stub.RunJob(request, metadata=first.auth(tenant))
    job_id = (await reading.read()).job_id
    leaving = second.stub.RunJob(request, metadata=second.auth(tenant))
    assert (await leaving.read()).job_id == job_id  # the same job, attached
    leaving.cancel()
    first.jobs[tenant].append(job_id)
    events = []
    while (event := await reading.read()) is not grpc.aio.EOF:
        events.append(event)
    return events[-1].job_finished.job.state


async def test_a_second_client_leaving_does_not_cancel_the_first_clients_job() -> None:
    async with reliable_gateway(core=sim_core(0.005)) as h:
        await h.tenant("acme")
        assert await second_client_leaves(h, h, "acme", roots(1, 100)) == pb.JOB_STATE_SUCCEEDED
        await h.unharmed()


async def test_a_deadline_cancels_unfinished_nodes_and_fails_the_job() -> None:
    async with reliable_gateway(core=sim_core(0.01)) as h:
        await h.tenant("acme")
        spec = pb.JobSpec(nodes=[node("long", "go", 300), node("after", "then", 8, "long")])
        spec.deadline.FromNanoseconds(time.time_ns() + 1_500_000_000)
        job = await h.run("acme", spec)
        assert job.state == pb.JOB_STATE_FAILED
        assert {n.state for n in job.nodes} == {pb.NODE_STATE_CANCELLED}
        assert all(n.reason == "deadline exceeded" for n in job.nodes)
        past = roots(1)
        past.deadline.FromNanoseconds(time.time_ns() - 10_000_000_000)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.submit("acme", past)
        assert code_of(refused) == grpc.StatusCode.INVALID_ARGUMENT
        await h.unharmed()


async def test_priority_orders_a_tenants_own_jobs() -> None:
    async with reliable_gateway(core=sim_core(0.002)) as h:
        await h.tenant("acme", max_concurrent_calls=1)
        blocker = await h.submit("acme", roots(1, 500))  # runs first, alone, for a second
        low = await h.submit("acme", pb.JobSpec(nodes=[node("a", "low", 10)], priority=-1))
        plain = await h.submit("acme", pb.JobSpec(nodes=[node("a", "plain", 10)]))
        high = await h.submit("acme", pb.JobSpec(nodes=[node("a", "high", 10)], priority=5))
        jobs = [await h.finished("acme", j.job_id) for j in (blocker, low, plain, high)]
        starts = [job.nodes[0].start_time.ToNanoseconds() for job in jobs]
        assert starts[0] < starts[3] < starts[2] < starts[1]  # blocker, high, plain, low
        await h.unharmed()


async def test_one_tenants_churn_never_evicts_anothers_jobs() -> None:
    async with reliable_gateway(retained_jobs_per_tenant=5) as h:
        await h.tenant("quiet")
        await h.tenant("churn")
        kept = await h.run("quiet", roots(1))
        churned = [await h.run("churn", roots(1)) for _ in range(12)]
        request = pb.GetJobRequest(job_id=kept.job_id)
        assert (await h.stub.GetJob(request, metadata=h.auth("quiet"))).job_id == kept.job_id
        first = h.jobs.pop("churn")[0]
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await h.stub.GetJob(pb.GetJobRequest(job_id=first), metadata=h.auth("churn"))
        assert code_of(gone) == grpc.StatusCode.NOT_FOUND
        await h.unharmed()
        usage = await h.usage("churn")  # the evicted jobs were settled all the same
        assert usage.output_tokens == sum(j.usage.output_tokens for j in churned)


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_a_tenants_large_ended_jobs_are_held_in_bounded_memory(
    request: pytest.FixtureRequest, tmp_path: Path, store: str
) -> None:
    """Ended jobs are kept by size too: six jobs of 100,000 characters (an input no node uses)
    against 250,000 bytes keep the last two; the other tenant's job is kept all the same. With
    the redis store the journal keeps them so too (any replica answers from it)."""
    replica: dict[str, Any] = {}
    if store == "redis":
        redis = request.getfixturevalue("redis")
        replica = {
            "store": RedisQuotaStore(redis.url),
            "store_url": redis.url,
            "outbox_file": tmp_path / "outbox.jsonl",
        }
    async with reliable_gateway(retained_bytes_per_tenant=250_000, **replica) as h:
        await h.tenant("quiet")
        await h.tenant("big")
        kept = await h.run("quiet", roots(1))
        large = roots(1)
        letters = random.Random(5)  # text that does not compress: the journal compresses specs
        large.inputs["unused"] = "".join(letters.choices(string.ascii_letters, k=100_000))
        jobs = [await h.run("big", large) for _ in range(6)]
        for job, found in zip(jobs, [False] * 4 + [True] * 2, strict=True):
            request = pb.GetJobRequest(job_id=job.job_id)
            if found:
                assert (await h.stub.GetJob(request, metadata=h.auth("big"))).job_id == job.job_id
            else:
                with pytest.raises(grpc.aio.AioRpcError) as gone:
                    await h.stub.GetJob(request, metadata=h.auth("big"))
                assert code_of(gone) == grpc.StatusCode.NOT_FOUND
        request = pb.GetJobRequest(job_id=kept.job_id)
        assert (await h.stub.GetJob(request, metadata=h.auth("quiet"))).job_id == kept.job_id
        h.jobs.pop("big")
        await h.unharmed()
        usage = await h.usage("big")  # the dropped jobs were settled all the same
        assert usage.output_tokens == sum(j.usage.output_tokens for j in jobs)


async def test_open_streams_are_capped_per_tenant() -> None:
    async with reliable_gateway(core=sim_core(0.01)) as h:
        await h.tenant("acme", max_streams=2)
        job = await h.submit("acme", roots(1, 200))
        watches = [
            h.stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), metadata=h.auth("acme"))
            for _ in range(2)
        ]
        for watch in watches:
            await watch.read()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            third = h.stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), metadata=h.auth("acme"))
            await third.read()
        assert code_of(refused) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "QUOTA_STREAMS" in str(refused.value.trailing_metadata())
        for watch in watches:
            watch.cancel()
        await h.stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id), metadata=h.auth("acme"))
        await h.unharmed()


async def test_a_full_gateway_refuses_new_jobs_as_overloaded() -> None:
    async with reliable_gateway(core=sim_core(0.01), max_active_jobs=2) as h:
        await h.tenant("acme")
        held = [await h.submit("acme", roots(1, 200)) for _ in range(2)]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.submit("acme", roots(1))
        assert code_of(refused) == grpc.StatusCode.UNAVAILABLE
        assert "OVERLOADED" in str(refused.value.trailing_metadata())
        for job in held:
            await h.stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id), metadata=h.auth("acme"))
        await h.unharmed()


@pytest.mark.parametrize("temperature", [1e-40, float("nan"), float("inf"), 1e9])
async def test_sampling_values_that_would_make_nan_are_refused(temperature: float) -> None:
    async with reliable_gateway() as h:
        await h.tenant("acme")
        spec = roots(1)
        spec.nodes[0].sampling.temperature = temperature
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.submit("acme", spec)
        assert code_of(refused) == grpc.StatusCode.INVALID_ARGUMENT
        assert "temperature" in refused.value.details()
        await h.unharmed()


async def test_a_failing_engine_step_fails_its_calls_only() -> None:
    core = sim_core()
    runner = FlakyRunner(core.runner, fail_on={3})  # type: ignore[arg-type]
    core.runner = runner
    async with reliable_gateway(core=core) as h:
        await h.tenant("acme")
        job = await h.run("acme", roots(1, 8))
        assert job.state == pb.JOB_STATE_FAILED and job.nodes[0].reason == "engine error"
        await h.unharmed()  # the engine goes on serving


async def test_a_runjob_attached_to_a_submitted_job_does_not_cancel_it() -> None:
    async with reliable_gateway(core=sim_core(0.005)) as h:
        await h.tenant("acme")
        spec = roots(1, 100)
        spec.idempotency_key = "submitted"
        job = await h.submit("acme", spec)
        attached = h.stub.RunJob(pb.SubmitJobRequest(job=spec), metadata=h.auth("acme"))
        assert (await attached.read()).job_id == job.job_id
        attached.cancel()  # the watcher leaves; the job was SubmitJob's
        assert (await h.finished("acme", job.job_id)).state == pb.JOB_STATE_SUCCEEDED
        await h.unharmed()


async def test_health_is_not_serving_only_while_steps_keep_failing() -> None:
    core = sim_core()
    core.runner = FlakyRunner(core.runner, fail_on={1, 2, 3})  # type: ignore[arg-type]
    async with reliable_gateway(core=core) as h:
        await h.tenant("acme")
        statuses = h.health.Watch(health_pb2.HealthCheckRequest())
        assert (await statuses.read()).status == health_pb2.HealthCheckResponse.SERVING
        for _ in range(3):  # three failed steps in a row: the engine cannot serve
            assert (await h.run("acme", roots(1, 4))).state == pb.JOB_STATE_FAILED
        with anyio.fail_after(5):
            assert (await statuses.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            job = await h.run("acme", roots(1, 4))  # the next good step
            assert (await statuses.read()).status == health_pb2.HealthCheckResponse.SERVING
        assert job.state == pb.JOB_STATE_SUCCEEDED
        statuses.cancel()
        await h.unharmed()
