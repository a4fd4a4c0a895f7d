"""The consumer's end of a remote call, fed by hand as a call's task feeds it."""

from __future__ import annotations

import math

import anyio
import pytest
from anyio.streams.memory import MemoryObjectSendStream

from engine import FinishReason, TokenDelta
from gateway.backends.call_stream import CallControl, Item, RemoteCallStream

pytestmark = pytest.mark.anyio


def open_call() -> tuple[CallControl, MemoryObjectSendStream[Item], RemoteCallStream]:
    control = CallControl("c")
    send, receive = anyio.create_memory_object_stream[Item](math.inf)
    return control, send, RemoteCallStream(control, receive)


def delta(text: str, finished: bool = False) -> TokenDelta:
    reason = FinishReason.STOP if finished else None
    return TokenDelta("c", [7] * len(text), text, finished, reason)


def abort(control: CallControl, send: MemoryObjectSendStream[Item]) -> None:
    """The gateway aborts the call (a yield, say); its task ends and closes its end."""
    control.abort()
    send.close()
    control.ended.set()


async def test_an_answer_whole_in_the_buffer_is_handed_out_after_an_abort() -> None:
    # the server's last chunks came in one read before the yield's abort: the answer is whole,
    # and stopping without it threw it away (the node ran again from its prompt)
    control, send, stream = open_call()
    send.send_nowait(delta("part "))
    assert (await stream.__anext__()).text == "part "
    send.send_nowait(delta("more "))
    send.send_nowait(delta("end", finished=True))
    abort(control, send)
    rest = [d async for d in stream]
    assert [d.text for d in rest] == ["more ", "end"] and rest[-1].finished
    assert stream.finished
    await stream.aclose()


async def test_an_aborted_call_without_its_finished_delta_ends_quietly() -> None:
    control, send, stream = open_call()
    send.send_nowait(delta("part "))
    send.send_nowait(delta("more "))
    abort(control, send)
    assert [d async for d in stream] == []  # an aborted attempt's tokens are not handed out
    assert not stream.finished
    await stream.aclose()
