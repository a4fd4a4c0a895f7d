"""The tests' event loop drops exactly the stale grpc.aio completions a closed loop leaves: the
error grpc's poller raises handing one to a closed loop, and nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tests.event_loop import TestEventLoop


def closed_loop_error() -> None:
    raise RuntimeError("Event loop is closed")


def poller_handing_a_completion_to_a_closed_loop() -> None:
    closed_loop_error()


# the name grpc's Cython poller callback carries in the loop's handles
poller_handing_a_completion_to_a_closed_loop.__qualname__ = "PollerCompletionQueue._handle_events"


def reported_on_the_test_loop(*callbacks: Callable[[], None]) -> list[dict[str, Any]]:
    reported: list[dict[str, Any]] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context))
        done = asyncio.Event()
        for callback in callbacks:
            loop.call_soon(callback)
        loop.call_soon(done.set)
        await done.wait()

    with asyncio.Runner(loop_factory=TestEventLoop) as runner:
        runner.run(run())
    return reported


def test_the_poller_s_closed_loop_error_is_dropped() -> None:
    assert reported_on_the_test_loop(poller_handing_a_completion_to_a_closed_loop) == []


def test_every_other_callback_error_still_reaches_the_handler() -> None:
    reported = reported_on_the_test_loop(
        poller_handing_a_completion_to_a_closed_loop, closed_loop_error, lambda: 1 / 0
    )
    assert [type(context["exception"]) for context in reported] == [RuntimeError, ZeroDivisionError]
    assert "closed_loop_error" in repr(reported[0]["handle"])
