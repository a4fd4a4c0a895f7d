"""A real gateway before the in-process `fairgate engine serve` app (the `openai` backend): what a
tenant sees of the server's answers."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from grpc_health.v1 import health_pb2

from fairgate.v1 import gateway_pb2 as pb
from tests.gateway.backends.conftest import Remote, remote, settings
from tests.gateway.engine_servers import model_folder
from tests.reliability.harness import node, reliable_gateway

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


async def test_health_follows_the_remote_backends(server: Remote, tmp_path: Path) -> None:
    """With remote backends only, health stayed SERVING with every backend dead: a load
    balancer kept sending a gateway that could run nothing."""
    async with reliable_gateway(backends=[settings(server.url, model_folder(tmp_path))]) as h:
        watch = h.health.Watch(health_pb2.HealthCheckRequest())
        states = aiter(watch)
        assert (await anext(states)).status == health_pb2.HealthCheckResponse.SERVING
        server.gate.failing["/health"] = 503
        with anyio.fail_after(5):
            assert (await anext(states)).status == health_pb2.HealthCheckResponse.NOT_SERVING
        server.gate.failing.clear()
        with anyio.fail_after(5):
            assert (await anext(states)).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
