"""The dispatch loop: ready calls go to the engine in policy order, only when it has room.

Jobs are admitted against the tenant's quotas, then join the fair-share policy; a node whose
parents are done is rendered, tokenized and handed to the policy as a ready call. The loop asks
the policy for the next call and dispatches it only when the engine can admit it now (KV for
prompt + reservation, a batch slot), so the engine's own waiting list stays short and the
policy's order is the order that runs. Each dispatched call reserves its worst case (prompt +
max_tokens) in the quota store, then a follower task streams its tokens into the job and, when
it ends, settles (or releases) the reservation exactly once, tells the policy what it really
cost, and releases dependents; a call planned for refinement is predicted again from its
prompt's hidden state once prefilled (its engine reservation and its job's key follow). Round
trips are saved where the contract allows: a one-call job that the engine would take at once
reserves its call in the same script as its admission, and a job's last call finishes the job
in the same script as its settle, before its end is streamed.

Invariant: every dispatched call's reservation is settled or released exactly once, in a
`finally` shielded from cancellation, and one held from admission but never dispatched is
released when its job ends; a call refused by a rate limit waits and is retried.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup
from opentelemetry import trace

from engine import AsyncEngine, FinishReason, RequestStream, TokenDelta
from gateway.calls import CallPlanner, CallRefused
from gateway.job_run import JobRun, NodeState
from gateway.room import WaitingCalls, has_room
from gateway.spans import annotate_call, start_job_span
from gateway.tickets import Ticket, Tickets
from tenants import QuotaExceeded, QuotaLimit, QuotaStore, QuotaUnavailable, TenantQuota
from tenants.policies import EngineLoad, JobInfo, Policy


@dataclass(slots=True)
class Admitted:
    """A job the store has admitted: its costs for the policy, its roots' encoded prompts, and
    the ticket of a one-call job that was planned before admission (held or not)."""

    info: JobInfo
    encoded: dict[str, list[int]]
    ticket: Ticket | None = None


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    model_name: str
    reservation_ttl_s: float = 600.0
    knee_calls: int | None = None


class Dispatcher:
    def __init__(
        self,
        engine: AsyncEngine,
        policy: Policy,
        store: QuotaStore,
        tokenizer: Any,
        planner: CallPlanner,
        config: DispatchConfig,
        clock: Callable[[], float] = time.time,
        on_job_end: Callable[[JobRun], None] = lambda run: None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.store = store
        self.tokenizer = tokenizer
        self.planner = planner
        self._tickets = Tickets(tokenizer, planner, config.model_name)
        self.config = config
        self.clock = clock
        self.on_job_end = on_job_end
        self.tickets: dict[str, Ticket] = {}
        self.running: dict[str, RequestStream] = {}
        self._quotas: dict[str, TenantQuota] = {}
        self._wake = anyio.Event()
        self._tg: TaskGroup | None = None
        self._stack = contextlib.AsyncExitStack()
        self._tracer = tracer  # None: no spans
        self._job_spans: dict[str, trace.Span] = {}
        self._followed: dict[str, dict[str, Ticket]] = {}  # job id -> call id -> in the engine
        self._waiting = WaitingCalls(engine.core.block_manager.blocks_for)
        self._finished_in_store: set[str] = set()  # jobs whose last settle finished them

    async def __aenter__(self) -> Dispatcher:
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._tg.start_soon(self._loop)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._stack.aclose()
            self._tg = None

    async def admit(self, run: JobRun, quota: TenantQuota) -> Admitted:
        """Admit a job in the quota store (raises its refusals); `submit` it next. A one-call
        job that the engine would take at once has its call reserved in the same script."""
        info, encoded = self._tickets.job_info(run, quota, self.clock())
        ticket = self._ticket_to_hold(run, quota, encoded)
        if ticket is None:
            await self.store.admit_job(run.tenant_id, run.job_id, len(run.nodes))
        else:
            held = await self.store.admit_job_and_reserve(
                run.tenant_id,
                run.job_id,
                len(run.nodes),
                ticket.call.call_id,
                ticket.quota_tokens,
                self.config.reservation_ttl_s,
            )
            ticket.held = held is not None
        return Admitted(info, encoded, ticket)

    def submit(self, run: JobRun, quota: TenantQuota, admitted: Admitted | None = None) -> None:
        """Add an admitted job: it joins the policy and its roots become ready."""
        now = self.clock()
        self._quotas[run.tenant_id] = quota
        if self._tracer is not None:
            self._job_spans[run.job_id] = start_job_span(self._tracer, run)
        if admitted is None:
            admitted = Admitted(*self._tickets.job_info(run, quota, now))
        self.policy.add_job(admitted.info, now)
        for node_id in run.start(now):
            ticket = admitted.ticket
            if ticket is not None and ticket.call.node_id == node_id:
                self.tickets[ticket.call.call_id] = ticket
                self.policy.add_ready(ticket.call, now)
            else:
                self._make_ready(run, node_id, now, admitted.encoded.get(node_id))
        self._wake.set()

    def running_jobs(self) -> list[JobRun]:
        """Jobs with a call in the engine or waiting for it."""
        runs = {id(t.run): t.run for t in self.tickets.values()}
        runs.update({id(t.run): t.run for c in self._followed.values() for t in c.values()})
        return [r for r in runs.values() if not r.ended]

    def cancel(self, run: JobRun, reason: str = "cancelled") -> None:
        """Cancel a job: running calls are aborted (their followers release their quota)."""
        now = self.clock()
        for node_id in run.cancel(now, reason):
            self.engine.abort(f"{run.job_id}/{node_id}")
        self._forget(run, now)

    def _ticket_to_hold(
        self, run: JobRun, quota: TenantQuota, encoded: dict[str, list[int]]
    ) -> Ticket | None:
        """The ticket of a one-call job that the next dispatch pass will start whatever the
        policy's order: the engine, below its knee, has room for it and every ready call."""
        cap, ready, knee = self.engine.capacity, len(self.tickets), self.config.knee_calls
        if len(run.nodes) != 1 or cap.free_seqs <= ready:
            return None
        if knee is not None and cap.num_running + cap.num_waiting + ready >= knee:
            return None
        (node_id,) = run.nodes
        try:
            ticket = self._tickets.make(run, node_id, quota, encoded[node_id])
        except CallRefused:
            return None  # refused again once submitted, where its node fails
        if self._waiting:
            self._waiting.prune(self.engine.core.scheduler.requests)
        blocks_for = self.engine.core.block_manager.blocks_for
        free = cap.free_blocks - self._waiting.blocks
        for other in (ticket, *self.tickets.values()):  # at most free_seqs of them
            free -= blocks_for(other.call.prompt_tokens + other.plan.reserve_output)
            if free < 0:
                return None
        return ticket

    def _make_ready(
        self, run: JobRun, node_id: str, now: float, prompt_ids: list[int] | None = None
    ) -> None:
        try:
            ticket = self._tickets.make(run, node_id, self._quotas[run.tenant_id], prompt_ids)
        except CallRefused as exc:
            self._finish_node(run, node_id, NodeState.FAILED, str(exc))
            return
        self.tickets[ticket.call.call_id] = ticket
        self.policy.add_ready(ticket.call, now)

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self._dispatch_ready()

    def _load(self) -> EngineLoad:
        cap = self.engine.capacity
        return EngineLoad(cap.num_running + cap.num_waiting, 0, self.config.knee_calls)

    async def _dispatch_ready(self) -> None:
        while (call := self.policy.peek(self.clock(), self._load())) is not None:
            ticket = self.tickets[call.call_id]
            if not self._has_room(call.prompt_tokens + ticket.plan.reserve_output):
                return  # woken again when a running call ends
            self.policy.mark_dispatched(call.call_id, self.clock())
            del self.tickets[call.call_id]
            if ticket.held or await self._reserve(ticket):
                self._start(ticket)

    def _has_room(self, num_tokens: int) -> bool:
        if self._waiting:
            self._waiting.prune(self.engine.core.scheduler.requests)
        blocks_for = self.engine.core.block_manager.blocks_for
        return has_room(self.engine.capacity, blocks_for, num_tokens, self._waiting.blocks)

    async def _reserve(self, ticket: Ticket) -> bool:
        call = ticket.call
        try:
            await self.store.reserve(
                call.tenant_id, call.call_id, ticket.quota_tokens, self.config.reservation_ttl_s
            )
        except QuotaExceeded as exc:
            if exc.retry_after_s is None or exc.limit is QuotaLimit.DAILY_BUDGET:
                self._finish_node(ticket.run, call.node_id, NodeState.FAILED, str(exc))
            else:
                assert self._tg is not None
                self._tg.start_soon(self._retry_later, ticket, exc.retry_after_s)
            return False
        except QuotaUnavailable as exc:
            reason = f"quota store unavailable: {exc}"
            self._finish_node(ticket.run, call.node_id, NodeState.FAILED, reason)
            return False
        return True

    async def _retry_later(self, ticket: Ticket, delay: float) -> None:
        await anyio.sleep(max(delay, 0.01))
        if ticket.run.ended:
            return
        self.tickets[ticket.call.call_id] = ticket
        self.policy.add_ready(ticket.call, self.clock())
        self._wake.set()

    def _start(self, ticket: Ticket) -> None:
        call = ticket.call
        ticket.priority = self.policy.priority(call.call_id)
        stream = self.engine.add_request(
            ticket.prompt_ids,
            ticket.plan.params,
            request_id=call.call_id,
            priority=ticket.priority,
            predicted_output_len=ticket.plan.reserve_output,
        )
        self.running[call.call_id] = stream
        self._followed.setdefault(call.job_id, {})[call.call_id] = ticket
        self._waiting.add(call.call_id, call.prompt_tokens, ticket.plan.reserve_output)
        ticket.run.mark_running(call.node_id, call.prompt_tokens, self.clock())
        assert self._tg is not None
        self._tg.start_soon(self._follow, ticket, stream)

    async def _follow(self, ticket: Ticket, stream: RequestStream) -> None:
        call, run = ticket.call, ticket.run
        last: TokenDelta | None = None
        last_at = 0.0
        produced = 0
        with self._call_span(run) as span:
            try:
                async for delta in stream:
                    produced += len(delta.token_ids)
                    last_at = self.clock()
                    if not delta.finished:  # the last tokens join the job with the call's end
                        run.add_tokens(call.node_id, delta.text, tuple(delta.token_ids), last_at)
                    if not run.ended:  # an ended job has left the policy
                        self._progress(ticket, delta, produced)
                    last = delta
            finally:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()  # aborts the request if it has not finished
                    await self._close_call(ticket, last, last_at, produced)
                    if span is not None:
                        annotate_call(span, ticket, last, produced)

    def _progress(self, ticket: Ticket, delta: TokenDelta, produced: int) -> None:
        if delta.hidden is not None and ticket.plan.refinable:
            self._refine(ticket, delta.hidden)
        call = ticket.call
        self.policy.on_progress(call.call_id, produced, self.clock())
        if produced > call.predicted_output:  # charged the excess: re-keyed
            self._refresh_priorities(call.job_id)

    def _refine(self, ticket: Ticket, hidden: list[float]) -> None:
        """The call is prefilled: predict its output again from its hidden state; the engine
        moves its KV reservation and the policy re-keys its job (an event on the call's span)."""
        before = ticket.plan
        ticket.plan = self.planner.refine(before, hidden)
        call = ticket.call = dataclasses.replace(
            ticket.call, predicted_output=ticket.plan.policy_output
        )
        trace.get_current_span().add_event(
            "fairgate.prediction.refined",
            {
                "fairgate.predicted_output_tokens.before": before.policy_output,
                "fairgate.predicted_output_tokens": ticket.plan.policy_output,
                "fairgate.reserved_output_tokens": ticket.plan.reserve_output,
            },
        )
        self.engine.set_prediction(call.call_id, ticket.plan.reserve_output)
        self.policy.on_refined(call.call_id, call.predicted_output, self.clock())
        self._refresh_priorities(call.job_id)

    def _call_span(self, run: JobRun) -> contextlib.AbstractContextManager[trace.Span | None]:
        """The call's `chat <model>` span under its job's span; nothing when not tracing."""
        if self._tracer is None:
            return contextlib.nullcontext()
        parent = trace.set_span_in_context(self._job_spans.get(run.job_id, trace.INVALID_SPAN))
        name = f"chat {self.config.model_name}"
        return self._tracer.start_as_current_span(name, context=parent)

    async def _close_call(
        self, ticket: Ticket, last: TokenDelta | None, last_at: float, produced: int
    ) -> None:
        """Settle or release the call, then end its node. A finished call's last tokens are
        added only now, after the settle, next to the node's end (and the job's, if it was the
        last call): whoever watches the job gets them in one wake-up."""
        call, run = ticket.call, ticket.run
        self.running.pop(call.call_id, None)
        calls = self._followed[call.job_id]
        del calls[call.call_id]
        if not calls:
            del self._followed[call.job_id]
        self._waiting.discard(call.call_id)
        finished = last is not None and last.finished
        ends_job = finished and run.is_last_open(call.node_id)  # one script closes both
        try:
            if finished:
                await self.store.settle(
                    call.tenant_id,
                    call.call_id,
                    call.prompt_tokens,
                    produced,
                    finish_job=run.job_id if ends_job else None,
                )
            else:
                await self.store.release(call.tenant_id, call.call_id)
        except QuotaUnavailable:
            ends_job = False  # the reservation expires on its own: nothing leaks
        if ends_job and not run.ended:
            self._finished_in_store.add(run.job_id)
        now = self.clock()
        if not run.ended:
            self.policy.on_finished(call.call_id, call.prompt_tokens, produced, now)
            self._refresh_priorities(call.job_id)  # re-keyed with the truth
        if last is not None and last.finished:
            run.add_tokens(call.node_id, last.text, tuple(last.token_ids), last_at)
            self.planner.predictor.observe(ticket.plan.features, produced)
            hit_length = last.finish_reason is FinishReason.LENGTH
            run.nodes[call.node_id].hit_length = hit_length
            if hit_length and ticket.plan.cap_reason:
                self._finish_node(run, call.node_id, NodeState.CAPPED, ticket.plan.cap_reason)
            else:
                self._finish_node(run, call.node_id, NodeState.SUCCEEDED, "")
        elif not run.ended:
            self._finish_node(run, call.node_id, NodeState.FAILED, "call aborted by the engine")
        self._wake.set()

    def _refresh_priorities(self, job_id: str) -> None:
        """Tell the engine the new priority of the job's calls it holds, after a re-key."""
        for call_id, ticket in self._followed.get(job_id, {}).items():
            priority = self.policy.priority(call_id)
            if priority != ticket.priority:
                ticket.priority = priority
                self.engine.set_priority(call_id, priority)

    def _finish_node(self, run: JobRun, node_id: str, state: NodeState, reason: str) -> None:
        now = self.clock()
        for ready in run.finish_node(node_id, state, now, reason):
            self._make_ready(run, ready, now)
        if run.ended:
            self._forget(run, now)
        self._wake.set()

    def _forget(self, run: JobRun, now: float) -> None:
        self.policy.remove_job(run.job_id, now)
        assert self._tg is not None
        for call_id in [c for c, t in self.tickets.items() if t.run is run]:
            if self.tickets.pop(call_id).held:  # reserved with the job, never dispatched
                self._tg.start_soon(self._release_held, run.tenant_id, call_id)
        span = self._job_spans.pop(run.job_id, None)
        if span is not None:
            span.set_attribute("fairgate.job.state", run.state.value)
            span.end()
        self.on_job_end(run)
        if run.job_id in self._finished_in_store:
            self._finished_in_store.discard(run.job_id)
        else:
            self._tg.start_soon(self._end_job, run)
        self._wake.set()

    async def _end_job(self, run: JobRun) -> None:
        with anyio.CancelScope(shield=True), contextlib.suppress(QuotaUnavailable):
            await self.store.finish_job(run.tenant_id, run.job_id)

    async def _release_held(self, tenant_id: str, call_id: str) -> None:
        with anyio.CancelScope(shield=True), contextlib.suppress(QuotaUnavailable):
            await self.store.release(tenant_id, call_id)
