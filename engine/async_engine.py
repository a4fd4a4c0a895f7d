"""The async front: token streams per request over one owned step loop.

The step loop is a task in the engine's own task group; each model step runs in a worker
thread so the event loop keeps serving while the model computes. Everything that changes the
scheduler (add, abort, priority) happens on the event loop between steps: while a step is in
flight such changes are queued and applied the moment it returns, so an abort frees the
request's blocks at once, or at the end of the step that is using them. An abort that lands
while the step that finishes its request runs comes too late: the request's stream is kept until
the step ends and gets its finished delta then (a finished answer is not thrown away); a request
the step did not finish has its stream closed then. `capacity` counts what
the next step will have: the requests added while a step runs (waiting) and the slots of those
aborted meanwhile (free; they still run, with their blocks, until the step ends), so a gateway
can send a call into the slot of one it aborts and the step's end takes both.

A failing step never ends the loop. When the model runner raises, the core fails that step's
requests with `FinishReason.ERROR`; when anything else in a step raises (the scheduler's update,
say), no request's progress can be trusted, so every live request is failed with ERROR; either
way the exception is logged and the loop carries on with the requests that come next. `healthy`
turns False after `max_consecutive_failures` failed steps in a row and True again at the next
good one; `health_changed()` wakes whoever follows it. `wait_idle()` returns once nothing is
left: every request finished or aborted, its blocks freed, and no step in flight.

Invariant: every stream ends with exactly one delta whose `finished` is True, or is closed by
`abort`/`aclose` (at the end of the step in flight, if any), and every request the engine
accepted is finished, aborted or live.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from engine.errors import DuplicateRequest, EngineClosed
from engine.llm import LLMEngine, RequestOutput
from engine.request import FinishReason, Request
from engine.sampling import SamplingParams
from engine.scheduler import Capacity, check_prediction
from engine.sim_runner import StepShape
from engine.step_fit import StepFit

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TokenDelta:
    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    hidden: list[float] | None = None
    request: Request | None = None  # the finished request (lengths, timings), on the last delta


class RequestStream:
    """Async iterator of one request's deltas; closing it early aborts the request."""

    def __init__(
        self,
        request_id: str,
        receive: MemoryObjectReceiveStream[TokenDelta],
        on_close: Callable[[], None],
    ) -> None:
        self.request_id = request_id
        self._receive = receive
        self._on_close = on_close
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> TokenDelta:
        try:
            delta = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._receive.close()
            raise StopAsyncIteration from None
        self.finished = delta.finished
        if delta.finished:
            self._receive.close()
        return delta

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop listening; aborts the request when it has not finished."""
        if not self.finished:
            self._on_close()
        self._receive.close()


class AsyncEngine:
    def __init__(
        self, core: LLMEngine, run_in_thread: bool = True, max_consecutive_failures: int = 3
    ) -> None:
        if max_consecutive_failures < 1:
            raise ValueError("max_consecutive_failures must be >= 1")
        self.core = core
        self.max_consecutive_failures = max_consecutive_failures
        self._consecutive_failures = 0
        self.steps = 0  # steps run so far, failed ones too: a clock in the engine's own units
        self._health_flipped = anyio.Event()
        self._run_in_thread = run_in_thread
        # the steps' own worker thread: requests' parsing and tokenizing, however many, hold
        # the default pool's, and must not keep the engine from stepping
        self._step_thread = anyio.CapacityLimiter(1)
        self._streams: dict[str, MemoryObjectSendStream[TokenDelta]] = {}
        self._pending: list[Callable[[], None]] = []
        self._aborting: set[str] = set()  # ids whose abort waits in `_pending`
        # the streams of requests aborted while the step in flight runs: that step may finish
        # them, and its finished delta is then theirs; closed when it ends
        self._cut: dict[str, MemoryObjectSendStream[TokenDelta]] = {}
        self._stepping = False
        self._wake = anyio.Event()
        self._idle = anyio.Event()  # set, and replaced, each time the loop finds nothing left
        self._tg: TaskGroup | None = None
        self._stack = contextlib.AsyncExitStack()
        self._closed = False
        self._capacity = core.scheduler.capacity()
        # the engine's speed, fitted from its own steps (in the steps' thread): the knee a
        # gateway may keep its batch below
        self.step_fit = StepFit(eager=True, max_batch=core.config.max_num_seqs)

    async def __aenter__(self) -> AsyncEngine:
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._tg.start_soon(self._loop)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed or self._tg is None:
            return
        self._closed = True
        self._tg.cancel_scope.cancel()
        try:
            await self._stack.aclose()
        finally:
            for rid in list(self._streams):
                self.abort(rid)
            self._close_cut()
            self._idle.set()  # the loop has ended: nothing steps any more

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        priority: float = 0.0,
        predicted_output_len: int | None = None,
        cache_salt: str = "",
    ) -> RequestStream:
        if self._closed:
            raise EngineClosed("engine is shut down")
        if request_id is not None and request_id in self._streams:
            raise DuplicateRequest(f"duplicate request id {request_id!r}")
        request = self.core.make_request(
            prompt_token_ids,
            params,
            request_id=request_id,
            priority=priority,
            predicted_output_len=predicted_output_len,
            cache_salt=cache_salt,
            # an attempt run again under its id while its last one's abort waits for the step
            # in flight: the abort is applied first
            replacing=request_id in self._aborting,
        )
        self._run(lambda: self.core.submit(request))
        self._capacity = self._capacity_after(request)
        send, receive = anyio.create_memory_object_stream[TokenDelta](math.inf)
        self._streams[request.request_id] = send
        self._wake.set()
        return RequestStream(request.request_id, receive, lambda: self._let_go(request, send))

    def _let_go(self, request: Request, send: MemoryObjectSendStream[TokenDelta]) -> None:
        """A stream closed before its end: its request is aborted, unless it has ended (its
        last delta unread) and its id now names another request."""
        if self._streams.get(request.request_id) is send:
            self.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks (now, or when the step in flight ends)."""
        send = self._streams.pop(request_id, None)
        if send is None:
            return
        self._capacity = self._capacity_without(request_id)
        if self._stepping and request_id not in self._aborting:
            self._cut[request_id] = send  # the step in flight may finish it: wait for it
        else:
            send.close()  # aborted again under its id: this one was sent after the step began
        if self._stepping:
            self._aborting.add(request_id)
        self._run(lambda: self._abort_core(request_id))

    def set_priority(self, request_id: str, priority: float) -> None:
        def apply() -> None:
            if request_id in self.core.scheduler.requests:
                self.core.scheduler.set_priority(request_id, priority)

        self._run(apply)

    def set_prediction(self, request_id: str, predicted_output_len: int) -> None:
        """A refined output prediction: the request's KV reservation follows it. Raises
        InvalidRequest for one no request can have (now, not when a deferred change applies)."""
        check_prediction(predicted_output_len)

        def apply() -> None:
            if request_id in self.core.scheduler.requests:
                self.core.scheduler.set_prediction(request_id, predicted_output_len)

        self._run(apply)

    @property
    def capacity(self) -> Capacity:
        return self._capacity

    def _run(self, change: Callable[[], None]) -> None:
        """Apply a scheduler change now, or right after the step in flight."""
        if self._stepping:
            self._pending.append(change)
        else:
            change()
            self._capacity = self.core.scheduler.capacity()

    def _capacity_after(self, request: Request) -> Capacity:
        """The capacity once a request added while a step runs is waiting."""
        cap = self._capacity
        if not self._stepping:
            return cap
        blocks = self.core.block_manager.blocks_for(self.core.scheduler.waiting_tokens(request))
        return dataclasses.replace(
            cap,
            free_blocks=cap.free_blocks - blocks,
            free_seqs=cap.free_seqs - 1,
            num_waiting=cap.num_waiting + 1,
        )

    def _capacity_without(self, request_id: str) -> Capacity:
        """The capacity once a request aborted while a step runs is gone: its slot is free for
        the next step now; it still counts as running, with its blocks, until the step ends
        (the step may be growing them: what it frees is known only then)."""
        cap = self._capacity
        if not self._stepping or request_id not in self.core.scheduler.requests:
            return cap
        return dataclasses.replace(cap, free_seqs=cap.free_seqs + 1)

    @property
    def healthy(self) -> bool:
        """False while the last `max_consecutive_failures` steps all failed, True again after
        the next good step.

        An isolated failure costs only its own requests (they end with `FinishReason.ERROR`)
        and leaves the engine healthy; a gateway reports NOT_SERVING only while steps keep
        failing, that is while the engine really cannot serve.
        """
        return self._consecutive_failures < self.max_consecutive_failures

    async def health_changed(self) -> None:
        """Return once `healthy` has flipped."""
        await self._health_flipped.wait()

    async def wait_idle(self) -> None:
        """Return once the engine has nothing left: no step in flight, every request finished
        or aborted, and so every block free (or once it is shut down).

        An abort or a closed stream takes effect at the end of the step in flight, if any, and
        a server notices a client that left only when its handler is cancelled: whoever must
        know that the engine let go of it (a drain before shutdown, a test of an abort) waits
        here rather than looking again and again.
        """
        while not self._closed and (self._stepping or self.core.has_unfinished):
            await self._idle.wait()

    @property
    def num_live(self) -> int:
        return len(self._streams)

    def _abort_core(self, request_id: str) -> None:
        self._aborting.discard(request_id)
        if request_id in self.core.scheduler.requests:
            self.core.abort(request_id)

    async def _loop(self) -> None:
        while True:
            if not self.core.has_unfinished:
                self._idle.set()
                self._idle = anyio.Event()
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            try:
                outputs = await self._step()
            except Exception:
                logger.exception("engine step failed outside the runner; failing every request")
                self._close_cut()
                self._apply_pending()
                self._record_step(failed=True)
                self._fail_live()
                continue
            # a request aborted while the step ran gets its answer if the step finished it (the
            # abort came too late), not an error the step failed it with (the abort stands);
            # its outputs are void when its id was submitted again meanwhile (they are not
            # the new request's)
            resubmitted = self._aborting & self._streams.keys()
            cut, self._cut = self._cut, {}
            self._apply_pending()
            self._record_step(failed=self.core.last_step_failed)
            for out in outputs:
                if out.request_id in resubmitted:
                    continue
                if out.request_id in cut:
                    if out.finished and out.finish_reason is not FinishReason.ERROR:
                        self._send(cut.pop(out.request_id), out)
                    continue
                self._deliver(out)
            for send in cut.values():
                send.close()

    def _apply_pending(self) -> None:
        for apply in self._pending:
            try:
                apply()
            except Exception:  # one request's change: the loop serves every request
                logger.exception("a change deferred past a step failed")
        self._pending.clear()
        self._capacity = self.core.scheduler.capacity()

    async def _step(self) -> list[RequestOutput]:
        self._stepping = True
        try:
            if self._run_in_thread:
                return await anyio.to_thread.run_sync(self._step_core, limiter=self._step_thread)
            outputs = self._step_core()
            await anyio.lowlevel.checkpoint()
            return outputs
        finally:
            self._stepping = False

    def _step_core(self) -> list[RequestOutput]:
        outputs = self.core.step()
        if self.core.last_step is not None:
            plan, seconds = self.core.last_step
            self.step_fit.observe(StepShape.of(plan), seconds)
        return outputs

    def _record_step(self, failed: bool) -> None:
        self.steps += 1
        was_healthy = self.healthy
        self._consecutive_failures = self._consecutive_failures + 1 if failed else 0
        if self.healthy != was_healthy:
            self._health_flipped.set()
            self._health_flipped = anyio.Event()

    def _fail_live(self) -> None:
        """End every live request with ERROR, freeing its blocks."""
        for out in self.core.fail_all():
            self._deliver(out)
        for rid in list(self._streams):  # finished by the broken step before it raised
            self._deliver(RequestOutput(rid, [], finished=True, finish_reason=FinishReason.ERROR))
        self._capacity = self.core.scheduler.capacity()

    def _close_cut(self) -> None:
        for send in self._cut.values():
            send.close()
        self._cut.clear()

    def _deliver(self, out: RequestOutput) -> None:
        send = self._streams.get(out.request_id)
        if send is None:
            return  # aborted while the step ran
        self._send(send, out)
        if out.finished:
            del self._streams[out.request_id]

    @staticmethod
    def _send(send: MemoryObjectSendStream[TokenDelta], out: RequestOutput) -> None:
        delta = TokenDelta(
            out.request_id,
            out.new_token_ids,
            out.new_text,
            out.finished,
            out.finish_reason,
            out.hidden,
            out.request,
        )
        # its reader may have let go (a stream closed while its abort waited for the step)
        with contextlib.suppress(anyio.BrokenResourceError):
            send.send_nowait(delta)
        if out.finished:
            send.close()
