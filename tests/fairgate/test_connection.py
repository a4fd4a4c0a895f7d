"""The connection under the clients: its close, its channel options, its streams' ends.

Against the harness's real gateway (tests/gateway/conftest.py), and a bare grpc.aio server
where a call must stay in flight.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import anyio
import grpc
import pytest

from fairgate import Client, ClientClosed, FairgateError, JobBuilder
from tests.fairgate.test_client import answering_get_job
from tests.gateway.conftest import Harness

pytestmark = pytest.mark.anyio
LONG = JobBuilder("long").node("a", prompt="x", max_tokens=2000).build()


@pytest.mark.engine_step_s(0.01)
async def test_a_watch_in_flight_when_its_client_closes_raises_client_closed(
    harness: Harness,
) -> None:
    """grpc.aio ends a call its channel's close cancels with a bare CancelledError: the task
    group took the watcher for cancelled and dropped it, neither ended nor failed."""
    alpha = Client(harness.target, harness.keys["alpha"])
    job = await alpha.submit_job(LONG)
    watching, raised = anyio.Event(), anyio.Event()

    async def watch() -> None:
        with pytest.raises(ClientClosed):
            async for _ in alpha.watch_job(job.job_id):
                watching.set()
        raised.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await watching.wait()
        await alpha.aclose()
    assert raised.is_set()
    with pytest.raises(ClientClosed):  # not grpc's UsageError
        await alpha.get_job(job.job_id)


async def test_a_unary_call_in_flight_when_its_client_closes_raises_client_closed() -> None:
    started, never = anyio.Event(), anyio.Event()
    raised = anyio.Event()

    async def get_job(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        started.set()
        await never.wait()
        return b""

    async def call(client: Client) -> None:
        with pytest.raises(ClientClosed):
            await client.get_job("job-1")
        raised.set()

    async with answering_get_job(get_job) as target:
        try:
            client = Client(target, "key")
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, client)
                await started.wait()
                await client.aclose()
        finally:
            never.set()
    assert raised.is_set()


async def test_channel_options_win_over_the_defaults(harness: Harness) -> None:
    """gRPC takes the first of two channel arguments of one name: the caller's came after the
    defaults, and a 64-byte receive limit left the 16 MiB default in force."""
    key = harness.keys["alpha"]
    small = [("grpc.max_receive_message_length", 64)]
    async with (
        Client(harness.target, key) as alpha,
        Client(harness.target, key, options=small) as tiny,
    ):
        job = await alpha.submit_job(JobBuilder().node("a", prompt="x", max_tokens=2).build())
        with pytest.raises(FairgateError, match="larger than max") as caught:
            await tiny.get_job(job.job_id)
    assert caught.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_stream_closed_early_ends_its_rpc_before_aclose_returns(harness: Harness) -> None:
    """The connection's stream inside `run_job`, `watch_job` and `generate` was left to the
    loop's async-generator finalizer: its RPC was cancelled by a task the loop made later, not
    when the caller's `aclose()` returned."""
    firstiter, finalizer = sys.get_asyncgen_hooks()
    finalized: list[str] = []

    def finalize(agen: AsyncGenerator[Any, None]) -> None:
        finalized.append(agen.__qualname__)
        if finalizer is not None:
            finalizer(agen)

    sys.set_asyncgen_hooks(firstiter, finalize)  # for generators first iterated from here on
    try:
        async with Client(harness.target, harness.keys["alpha"]) as alpha:
            job = await alpha.submit_job(LONG)
            streams = [alpha.run_job(LONG), alpha.watch_job(job.job_id), alpha.generate("go")]
            for stream in streams:
                async with aclosing(stream) as items:
                    await anext(items)
    finally:
        sys.set_asyncgen_hooks(firstiter, finalizer)
    assert [name for name in finalized if name.startswith("Connection.")] == []
