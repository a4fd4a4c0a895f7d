"""The consumer's end of one remote call: deltas from the call's task, an abort by closing.

The backend runs each call in a task of its own task group that sends deltas, then at most one
error, into a memory stream. This side hands them out. Closing it early (or the backend's
`abort`) cancels the call's task, whose HTTP response then closes: that disconnect is how a
vLLM-compatible server learns to abort the request. `aclose` returns once the task has ended, so
the connection is closed and the call's room released when it returns.
Invariant: an aborted call's stream ends quietly (like the engine's), after handing out its
finished delta if that had already come (the abort came too late: the answer is whole); a stream
that ends any other way without its finished delta raises `BackendLost`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from engine import TokenDelta
from gateway.backends.base import CallUsage
from gateway.backends.errors import BackendError, BackendLost

Item = TokenDelta | BackendError  # what a call's task sends


@dataclass(slots=True)
class CallControl:
    """Shared by a call's task and its stream."""

    call_id: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    ended: anyio.Event = field(default_factory=anyio.Event)  # the task is over
    aborted: bool = False  # the gateway stopped it (abort, or the stream closed early)
    usage: CallUsage | None = None  # set by the task before its last delta, or when it ends

    def abort(self) -> None:
        self.aborted = True
        self.scope.cancel()


class RemoteCallStream:
    def __init__(self, control: CallControl, receive: MemoryObjectReceiveStream[Item]) -> None:
        self.call_id = control.call_id
        self._control = control
        self._receive = receive
        self.finished = False
        self._kept: deque[TokenDelta] | None = None  # what an abort left to hand out

    @property
    def usage(self) -> CallUsage | None:
        return self._control.usage

    def __aiter__(self) -> RemoteCallStream:
        return self

    async def __anext__(self) -> TokenDelta:
        if self.finished:
            self._receive.close()
            raise StopAsyncIteration
        if self._control.aborted:
            return self._after_abort()
        try:
            item = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._receive.close()
            if self._control.aborted:
                raise StopAsyncIteration from None
            raise BackendLost(f"call {self.call_id}: the backend closed while it ran") from None
        if isinstance(item, BackendError):
            self._receive.close()
            raise item
        if item.finished:
            self.finished = True
            self._receive.close()
        return item

    def _after_abort(self) -> TokenDelta:
        """An aborted call hands out what it buffered only when that ends with its finished
        delta: the server had answered in full before the abort (a yield, say) could stop it,
        and the answer must not be thrown away; anything less is an aborted attempt's."""
        if self._kept is None:
            self._kept = deque()
            while True:
                try:
                    item = self._receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    item = None
                if not isinstance(item, TokenDelta):
                    self._kept.clear()  # no finished delta: nothing of it is handed out
                    break
                self._kept.append(item)
                if item.finished:
                    break
        if not self._kept:
            self._receive.close()
            raise StopAsyncIteration
        delta = self._kept.popleft()
        if delta.finished:
            self.finished = True
            self._receive.close()
        return delta

    async def __aenter__(self) -> RemoteCallStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop listening; aborts the call on the server when it has not finished."""
        self._receive.close()
        if not self.finished and not self._control.ended.is_set():
            self._control.abort()
            with anyio.CancelScope(shield=True):
                await self._control.ended.wait()
