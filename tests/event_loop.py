"""The event loop every async test runs on: asyncio's, minus one grpc.aio artefact of running
each test on a fresh loop. grpc.aio has one completion queue per process, bound to every loop that
used it; a call cancelled as a test's loop closes completes later, on whichever loop polls next,
and grpc hands it to the closed loop, which raises "Event loop is closed" in the next test
(https://github.com/grpc/grpc/pull/23377). That completion belongs to a call nobody can await any
more, so it is dropped; every other callback error still fails the test."""

from __future__ import annotations

import asyncio
from typing import Any


def stale_grpc_completion(context: dict[str, Any]) -> bool:
    """A completion of a grpc.aio call made on a loop that has since closed."""
    error = context.get("exception")
    return (
        isinstance(error, RuntimeError)
        and str(error) == "Event loop is closed"
        and "PollerCompletionQueue._handle_events" in repr(context.get("handle"))
    )


class TestEventLoop(asyncio.SelectorEventLoop):
    __test__ = False  # not a test class, despite its name

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        if not stale_grpc_completion(context):
            super().call_exception_handler(context)
