"""A real gateway before the in-process `fairgate engine serve` app (the `openai` backend): what a
tenant sees of the server's answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2

from fairgate.v1 import gateway_pb2 as pb
from tests.gateway.backends.conftest import Remote, remote, settings
from tests.gateway.engine_servers import model_folder
from tests.gateway.test_server import status_of
from tests.reliability.harness import Reliable, node, reliable_gateway

pytestmark = pytest.mark.anyio


async def test_a_call_the_server_refuses_fails_with_the_servers_reason(
    server: Remote, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 4xx is the server's answer about that call: its node fails saying so, not as a fault
    of the gateway's (which logs a traceback and tells the tenant only "internal error")."""
    async with reliable_gateway(backends=[settings(server.url, model_folder(tmp_path))]) as h:
        await h.tenant("a")
        server.gate.failing["/v1/completions"] = 400
        job = await h.run("a", pb.JobSpec(nodes=[node("n", "hello", 4)]))
        assert job.state == pb.JOB_STATE_FAILED
        (failed,) = job.nodes
        assert failed.state == pb.NODE_STATE_FAILED
        assert "refused" in failed.reason and "400: it failed" in failed.reason
        assert not [r for r in caplog.records if r.exc_info]  # no traceback for an answer
        server.gate.failing.clear()
        await h.unharmed()


@pytest.mark.parametrize("status", [401, 403, 404])
async def test_a_server_that_refuses_every_call_loses_them_to_a_good_one(
    tmp_path: Path, status: int
) -> None:
    """A key the server no longer takes, or a model it does not serve, refuses every call sent
    there: read as the call's own fault, each failed its job while a good server stood by, and
    the bad one, its breaker closed and its room freed at once, drew ever more calls."""
    folder = model_folder(tmp_path)
    async with remote() as good, remote() as bad:
        bad.gate.failing["/v1/completions"] = status
        backends = [
            settings(server.url, folder, name=name, breaker_failures=2)
            for name, server in (("good", good), ("bad", bad))
        ]
        async with reliable_gateway(backends=backends) as h:
            await h.tenant("a")
            finished: list[pb.Job] = []

            async def run(i: int) -> None:
                finished.append(await h.run("a", pb.JobSpec(nodes=[node("n", f"hi {i}")])))

            async with anyio.create_task_group() as tg:
                for i in range(10):
                    tg.start_soon(run, i)
            assert [job.state for job in finished] == [pb.JOB_STATE_SUCCEEDED] * 10
            assert not h.gateway.dispatcher.backends["bad"].capacity().healthy
            await h.unharmed()


@asynccontextmanager
async def down_meanwhile(h: Reliable, server: Remote) -> AsyncIterator[None]:
    """The server's /health fails inside the block: health, watched, turns NOT_SERVING on
    entry and SERVING again on exit."""
    watch = h.health.Watch(health_pb2.HealthCheckRequest())
    states = aiter(watch)
    assert (await anext(states)).status == health_pb2.HealthCheckResponse.SERVING
    server.gate.failing["/health"] = 503
    with anyio.fail_after(5):
        assert (await anext(states)).status == health_pb2.HealthCheckResponse.NOT_SERVING
    yield
    server.gate.failing.clear()
    with anyio.fail_after(5):
        assert (await anext(states)).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


async def test_health_follows_the_remote_backends(server: Remote, tmp_path: Path) -> None:
    """With remote backends only, health stayed SERVING with every backend dead: a load
    balancer kept sending a gateway that could run nothing."""
    backends = [settings(server.url, model_folder(tmp_path))]
    async with reliable_gateway(backends=backends) as h, down_meanwhile(h, server):
        pass


async def test_new_jobs_are_refused_while_no_backend_of_their_pool_serves(
    server: Remote, tmp_path: Path
) -> None:
    """A pool whose every backend was down still admitted new jobs, each to wait for as long as
    the outage lasted: its client hung, unable to tell a dead gateway from a busy one. Past
    `pool_down_after_s` they are refused with UNAVAILABLE, BACKENDS_UNAVAILABLE and a retry
    time, and taken again once a backend serves."""
    backends = [settings(server.url, model_folder(tmp_path))]
    async with reliable_gateway(backends=backends, pool_down_after_s=0.0) as h:
        await h.tenant("a")
        async with down_meanwhile(h, server):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await h.submit("a", pb.JobSpec(nodes=[node("n", "hello", 4)]))
        code, details = status_of(refused.value)
        assert code == grpc.StatusCode.UNAVAILABLE.value[0]
        reasons = [d.reason for d in details if isinstance(d, error_details_pb2.ErrorInfo)]
        retry = [d for d in details if isinstance(d, error_details_pb2.RetryInfo)]
        assert reasons == ["BACKENDS_UNAVAILABLE"] and len(retry) == 1
        assert "no backend of model" in refused.value.details()
        job = await h.run("a", pb.JobSpec(nodes=[node("n", "hello", 4)]))
        assert job.state == pb.JOB_STATE_SUCCEEDED
        await h.unharmed()
