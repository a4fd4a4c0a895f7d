"""The dispatch loop: ready calls go to the engine in policy order, only when it has room.

Jobs are admitted against the tenant's quotas, then join the fair-share policy; a node whose
parents are done is rendered and tokenized (in a worker thread, after its rendered size is
checked against the bound) and handed to the policy as a ready call. The loop asks the policy
for the next call and takes it only when the engine can admit it now (KV for prompt +
reservation, a batch slot, counting what calls handed out but not yet admitted will take), so
the engine's own waiting list stays short and the policy's order is the order that runs.

A taken call first reserves its worst case (prompt + max_tokens) in the quota store, in a task
of its own so that no slow store reply stalls the loop: meanwhile the policy holds it (it stays
ready, unseen) and its room is promised. A reserve that cannot reach the store is retried with
backoff until `reserve_deadline_s`; a quota refusal with a retry time holds the call's tenant
in the policy until then (or until one of its calls ends), so other tenants go on. A reserved
call is marked dispatched and started; a follower task streams its tokens into the job and, when
it ends, settles (or releases) the reservation exactly once through the outbox, tells the
policy what it really cost, and releases dependents. Reservations and admitted jobs are leases
that `Leases` renews while they run. A call planned for refinement is predicted again from its
prompt's hidden state once prefilled (its engine reservation and its job's key follow). A
one-call job that the engine would take at once reserves its call in the same script as its
admission, and a job's last call finishes the job in the same script as its settle.

Isolation: every task of one call (its preparation, its reserve, its follower) catches what it
raises and fails that call's node only; nothing a call does can end the loop.

Invariant: every reservation is settled or released exactly once (directly or through the
outbox), in a `finally` shielded from cancellation; a call is settled exactly when its node ends
SUCCEEDED or CAPPED (a cancel that comes once its end is seen is too late for it); one held from
admission but never dispatched is released when its job ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup
from opentelemetry import trace

from engine import AsyncEngine, FinishReason, RequestStream, TokenDelta
from gateway.calls import CallPlanner, CallRefused
from gateway.deadlines import Deadlines
from gateway.job_run import ENDED, JobRun, NodeState
from gateway.jobs import input_sizes, oversized_prompt, rendered_chars
from gateway.leases import Leases, reserve_within
from gateway.metrics import GatewayMetrics
from gateway.outbox import Close, Outbox
from gateway.owned import OwnsTasks
from gateway.room import WaitingCalls, has_room
from gateway.spans import annotate_call, start_job_span
from gateway.tickets import Blank, Ticket, Tickets
from tenants import (
    CallClosed,
    QuotaExceeded,
    QuotaLimit,
    QuotaStore,
    QuotaUnavailable,
    TenantNotFound,
    TenantQuota,
)
from tenants.policies import EngineLoad, JobInfo, Policy

log = logging.getLogger(__name__)
INTERNAL_ERROR = "internal error"


@dataclass(slots=True)
class Admitted:
    """A job the store has admitted: its costs for the policy, its nodes' blank prompts, and
    the ticket of a one-call job that was planned before admission (held or not)."""

    info: JobInfo
    blanks: dict[str, Blank]
    ticket: Ticket | None = None


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    model_name: str
    reservation_ttl_s: float = 60.0  # lease of a reservation or an admitted job, renewed
    knee_calls: int | None = None
    reserve_deadline_s: float = 30.0  # how long a reserve retries an unreachable store
    max_prompt_chars: int = 262_144  # bound on a rendered prompt, checked before rendering
    cache_salt_per_tenant: bool = False  # tenants never share prefix-cache blocks


class Dispatcher(OwnsTasks):
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
        outbox: Outbox | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        super().__init__()
        self.metrics = metrics
        self.engine = engine
        self.policy = policy
        self.store = store
        self.tokenizer = tokenizer
        self.planner = planner
        self._tickets = Tickets(tokenizer, planner, config.model_name)
        self.config = config
        self.clock = clock
        self.on_job_end = on_job_end
        self.outbox = outbox if outbox is not None else Outbox(store)
        self.leases = Leases(store, config.reservation_ttl_s)
        self.tickets: dict[str, Ticket] = {}  # ready calls in the policy
        self.reserving: dict[str, Ticket] = {}  # held in the policy while they reserve
        self.running: dict[str, RequestStream] = {}
        self.runs: dict[str, JobRun] = {}  # active jobs
        self._quotas: dict[str, TenantQuota] = {}
        self._wake = anyio.Event()
        self._tracer = tracer  # None: no spans
        self._job_spans: dict[str, trace.Span] = {}
        self._followed: dict[str, dict[str, Ticket]] = {}  # job id -> call id -> in the engine
        self._waiting = WaitingCalls(engine.core.block_manager.blocks_for)
        self._finished_in_store: set[str] = set()  # jobs whose last settle finished them
        self._deadlines = Deadlines(clock, self._expire)
        # one tokenizing worker per tenant: a tenant's large job never stalls another's
        self._tokenizing: dict[str, anyio.CapacityLimiter] = {}

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        await stack.enter_async_context(self.outbox)
        await stack.enter_async_context(self.leases)

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._loop)
        tg.start_soon(self._deadlines.run)

    async def admit(self, run: JobRun, quota: TenantQuota) -> Admitted:
        """Admit a job in the quota store (raises its refusals); `submit` it next. A one-call
        job that the engine would take at once has its call reserved in the same script."""
        blanks = await anyio.to_thread.run_sync(
            self._tickets.encode_blanks, run, limiter=self._limiter(run.tenant_id)
        )
        info = self._tickets.job_info(run, quota, self.clock(), blanks)
        ticket = self._ticket_to_hold(run, quota, blanks)
        try:
            await self._admit_in_store(run, ticket)
        except QuotaUnavailable:  # the script may still run once the store answers: undo it
            if ticket is not None:
                await self.outbox.send(Close("release", run.tenant_id, ticket.call.call_id))
            await self.outbox.send(Close("finish_job", run.tenant_id, run.job_id))
            raise
        return Admitted(info, blanks, ticket)

    async def _admit_in_store(self, run: JobRun, ticket: Ticket | None) -> None:
        ttl = self.config.reservation_ttl_s
        if ticket is None:
            await self.store.admit_job(run.tenant_id, run.job_id, len(run.nodes), ttl_s=ttl)
            return
        call = ticket.call
        held = await self.store.admit_job_and_reserve(
            run.tenant_id, run.job_id, len(run.nodes), call.call_id, ticket.quota_tokens, ttl,
            ttl_s=ttl,
        )
        ticket.held = held is not None

    def _limiter(self, tenant_id: str) -> anyio.CapacityLimiter:
        limiter = self._tokenizing.get(tenant_id)
        if limiter is None:
            limiter = self._tokenizing[tenant_id] = anyio.CapacityLimiter(1)
        return limiter

    def submit(self, run: JobRun, quota: TenantQuota, admitted: Admitted) -> None:
        """Add an admitted job: it joins the policy and its roots become ready."""
        now = self.clock()
        self.policy.add_job(admitted.info, now)  # validates: nothing is kept if it refuses
        self._quotas[run.tenant_id] = quota
        self.runs[run.job_id] = run
        self.leases.hold_job(run.tenant_id, run.job_id)
        if run.spec.deadline_unix_s is not None:
            self._deadlines.add(run.job_id, run.spec.deadline_unix_s)
        if self._tracer is not None:
            self._job_spans[run.job_id] = start_job_span(self._tracer, run)
        ticket = admitted.ticket
        if ticket is not None and ticket.held:
            self.leases.hold_call(run.tenant_id, ticket.call.call_id)
        for node_id in run.start(now):
            if ticket is not None and ticket.call.node_id == node_id:
                self._add_ready(ticket, now)
            else:
                self._plan_ready(run, node_id, admitted.blanks[node_id])
        self._wake.set()

    def running_jobs(self) -> list[JobRun]:
        """Jobs that have not ended."""
        return [r for r in self.runs.values() if not r.ended]

    def cancel(self, run: JobRun, reason: str = "cancelled", *, failed: bool = False) -> None:
        """Cancel a job: running calls are aborted (their followers release their quota);
        `failed` ends the job FAILED instead of CANCELLED."""
        if run.ended:
            return
        now = self.clock()
        for node_id in run.cancel(now, reason, failed=failed):
            self.engine.abort(f"{run.job_id}/{node_id}")
        if run.ended:
            self._forget(run, now)
        else:  # a finished call is being settled: the job ends with it
            self._withdraw_ready(run, now)

    def _expire(self, job_id: str) -> None:
        run = self.runs.get(job_id)
        try:
            if run is not None:
                self.cancel(run, "deadline exceeded", failed=True)
        except Exception:  # the deadline timer serves every job: it must go on
            log.exception("expiring %s", job_id)

    def _ticket_to_hold(
        self, run: JobRun, quota: TenantQuota, blanks: dict[str, Blank]
    ) -> Ticket | None:
        """The ticket of a one-call job that the next dispatch pass will start whatever the
        policy's order: the engine, below its knee, has room for it and every ready call."""
        cap, ready, load = self.engine.capacity, len(self.tickets), self._load()
        if len(run.nodes) != 1 or cap.free_seqs <= ready + len(self.reserving):
            return None
        if load.knee_calls is not None and load.running_calls + ready >= load.knee_calls:
            return None  # busy as the loop counts it: calls reserving count as running
        (node_id,) = run.nodes
        try:
            ticket = self._tickets.make(run, node_id, quota, blanks[node_id])
        except CallRefused:
            return None  # refused again once submitted, where its node fails
        free = self._free_blocks()
        blocks_for = self.engine.core.block_manager.blocks_for
        for other in (ticket, *self.tickets.values()):  # at most free_seqs of them
            free -= blocks_for(other.call.prompt_tokens + other.plan.reserve_output)
            if free < 0:
                return None
        return ticket

    def _plan_ready(self, run: JobRun, node_id: str, encoded: Blank) -> None:
        try:
            ticket = self._tickets.make(run, node_id, self._quotas[run.tenant_id], encoded)
        except CallRefused as exc:
            self._finish_node(run, node_id, NodeState.FAILED, str(exc))
            return
        self._add_ready(ticket, self.clock())

    def _add_ready(self, ticket: Ticket, now: float) -> None:
        self.tickets[ticket.call.call_id] = ticket
        self.policy.add_ready(ticket.call, now)

    async def _prepare(self, run: JobRun, node_id: str) -> None:
        """Render and encode a node whose parents are done (off the event loop), then make it
        ready; a prompt over the bound fails the node before any of it is rendered."""
        with self._failing_node(run, node_id):
            outputs = {a: len(run.nodes[a].output) for a in run.dag.ancestors(node_id)}
            size = rendered_chars(run.nodes[node_id].spec, input_sizes(run.spec.inputs), outputs)
            problem = oversized_prompt(size, self.config.max_prompt_chars)
            if problem is not None:
                self._finish_node(run, node_id, NodeState.FAILED, f"the prompt {problem}")
                return
            encoded = await anyio.to_thread.run_sync(
                self._tickets.encode_node, run, node_id, limiter=self._limiter(run.tenant_id)
            )
            if run.nodes[node_id].state is NodeState.READY:  # not cancelled meanwhile
                self._plan_ready(run, node_id, encoded)
                self._wake.set()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            try:
                self._dispatch_ready()
            except Exception:  # a policy bug must not end the gateway: the next wake retries
                log.exception("dispatch pass failed")

    def _load(self) -> EngineLoad:
        cap = self.engine.capacity
        busy = cap.num_running + cap.num_waiting + len(self.reserving)
        return EngineLoad(busy, 0, self.config.knee_calls)

    def _dispatch_ready(self) -> None:
        while (call := self.policy.peek(self.clock(), self._load())) is not None:
            ticket = self.tickets[call.call_id]
            if not self._has_room(call.prompt_tokens + ticket.plan.reserve_output):
                return  # woken again when a running call ends
            if ticket.held:
                self._launch(ticket)
                continue
            self.policy.hold(call.call_id)
            self.reserving[call.call_id] = ticket
            self.tasks.start_soon(self._reserve_and_launch, ticket)

    def _free_blocks(self) -> int:
        """Free KV blocks less what calls handed out and not yet admitted will take."""
        if self._waiting:
            self._waiting.prune(self.engine.core.scheduler.requests)
        blocks_for = self.engine.core.block_manager.blocks_for
        promised = sum(
            blocks_for(t.call.prompt_tokens + t.plan.reserve_output)
            for t in self.reserving.values()
        )
        return self.engine.capacity.free_blocks - self._waiting.blocks - promised

    def _has_room(self, num_tokens: int) -> bool:
        cap = self.engine.capacity
        room = dataclasses.replace(
            cap, free_seqs=cap.free_seqs - len(self.reserving), free_blocks=self._free_blocks()
        )
        return has_room(room, self.engine.core.block_manager.blocks_for, num_tokens, 0)

    async def _reserve_and_launch(self, ticket: Ticket) -> None:
        call, run = ticket.call, ticket.run
        with self._failing_node(run, call.node_id):
            try:
                deadline = self.clock() + self.config.reserve_deadline_s
                if run.spec.deadline_unix_s is not None:
                    deadline = min(deadline, run.spec.deadline_unix_s)
                await reserve_within(
                    self.store,
                    call.tenant_id,
                    call.call_id,
                    ticket.quota_tokens,
                    self.config.reservation_ttl_s,
                    deadline,
                    self.clock,
                )
            except QuotaExceeded as exc:
                self._refused(ticket, exc)
                return
            except QuotaUnavailable:
                # the reserve may have landed after all: close it
                await self._send(Close("release", call.tenant_id, call.call_id))
                self._drop_ready(ticket, "quota store unavailable")
                return
            except (CallClosed, TenantNotFound) as exc:
                self._drop_ready(ticket, str(exc))
                return
            finally:
                self.reserving.pop(call.call_id, None)  # its slot and blocks are free again
                self._wake.set()
            if run.ended or call.call_id not in self.tickets:  # cancelled meanwhile
                await self._send(Close("release", call.tenant_id, call.call_id))
                return
            self.leases.hold_call(call.tenant_id, call.call_id)
            self.policy.unhold(call.call_id)
            self._launch(ticket)

    def _refused(self, ticket: Ticket, exc: QuotaExceeded) -> None:
        """A quota refused the call: it waits, its tenant held, or fails when waiting is vain."""
        call = ticket.call
        if self.metrics is not None:
            self.metrics.refused(call.tenant_id, exc.reason)
        if call.call_id not in self.tickets:
            return  # its job ended meanwhile
        if exc.retry_after_s is None or exc.limit is QuotaLimit.DAILY_BUDGET:
            self._drop_ready(ticket, str(exc))
            return
        self.policy.unhold(call.call_id)
        delay = max(exc.retry_after_s, 0.01)
        self.policy.hold_tenant(call.tenant_id, self.clock() + delay)
        self.tasks.start_soon(self._wake_after, delay)

    async def _wake_after(self, delay: float) -> None:
        await anyio.sleep(delay)
        self._wake.set()

    def _drop_ready(self, ticket: Ticket, reason: str) -> None:
        """Fail a call that never reached the engine: the policy sees it end unserved."""
        call = ticket.call
        if self.tickets.pop(call.call_id, None) is not None:
            self._end_unserved(call.call_id, self.clock())
        self._finish_node(ticket.run, call.node_id, NodeState.FAILED, reason)
        self._call_ended(ticket, 0)

    def _call_ended(self, ticket: Ticket, produced: int) -> None:
        if self.metrics is not None:
            node = ticket.run.nodes[ticket.call.node_id]
            self.metrics.call_ended(ticket.call.tenant_id, node, produced, ticket.plan.conservative)

    def _launch(self, ticket: Ticket) -> None:
        """Start a reserved call in the engine; a call the engine refuses fails alone."""
        call = ticket.call
        self.policy.mark_dispatched(call.call_id, self.clock())
        del self.tickets[call.call_id]
        try:
            self._start_call(ticket)
        except Exception as exc:
            log.warning("the engine refused %s: %s", call.call_id, exc)
            self.tasks.start_soon(self._close_unstarted, ticket, str(exc))

    async def _close_unstarted(self, ticket: Ticket, reason: str) -> None:
        call = ticket.call
        with anyio.CancelScope(shield=True), self._failing_node(ticket.run, call.node_id):
            self.leases.drop_call(call.call_id)
            await self._send(Close("release", call.tenant_id, call.call_id))
            if not ticket.run.ended:
                self.policy.on_finished(call.call_id, call.prompt_tokens, 0, self.clock())
            self._finish_node(ticket.run, call.node_id, NodeState.FAILED, reason)
            self._call_ended(ticket, 0)

    def _start_call(self, ticket: Ticket) -> None:
        call = ticket.call
        ticket.priority = self.policy.priority(call.call_id)
        stream = self.engine.add_request(
            ticket.prompt_ids,
            ticket.plan.params,
            request_id=call.call_id,
            priority=ticket.priority,
            predicted_output_len=ticket.plan.reserve_output,
            cache_salt=call.tenant_id if self.config.cache_salt_per_tenant else "",
        )
        self.running[call.call_id] = stream
        self._followed.setdefault(call.job_id, {})[call.call_id] = ticket
        self._waiting.add(call.call_id, call.prompt_tokens, ticket.plan.reserve_output)
        ticket.run.mark_running(call.node_id, call.prompt_tokens, self.clock())
        self.tasks.start_soon(self._follow, ticket, stream)

    async def _follow(self, ticket: Ticket, stream: RequestStream) -> None:
        call, run = ticket.call, ticket.run
        last: TokenDelta | None = None
        last_at = 0.0
        produced = 0
        failure = ""  # why following the call failed, if it did
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
                    if delta.finished and delta.finish_reason is not FinishReason.ERROR:
                        run.finishing.add(call.node_id)  # a cancel from now on is too late
            except Exception:
                log.exception("following %s", call.call_id)
                failure = INTERNAL_ERROR
            finally:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()  # aborts the request if it has not finished
                    with self._failing_node(run, call.node_id):
                        await self._close_call(ticket, last, last_at, produced, failure)
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
        self,
        ticket: Ticket,
        last: TokenDelta | None,
        last_at: float,
        produced: int,
        failure: str = "",
    ) -> None:
        """Settle or release the call, then end its node. A finished call's last tokens are
        added only now, after the settle, next to the node's end (and the job's, if it was the
        last call): whoever watches the job gets them in one wake-up. A call that failed here
        (`failure`) or in the engine is released and its node fails."""
        call, run = ticket.call, ticket.run
        self.running.pop(call.call_id, None)
        calls = self._followed[call.job_id]
        del calls[call.call_id]
        if not calls:
            del self._followed[call.job_id]
        self._waiting.discard(call.call_id)
        self.leases.drop_call(call.call_id)
        self.policy.unhold_tenant(call.tenant_id)  # a concurrency slot is free again
        engine_error = last is not None and last.finish_reason is FinishReason.ERROR
        finished = not failure and last is not None and last.finished and not engine_error
        # a call is charged exactly when its node succeeds: one cancelled before its end was
        # seen is released like any cancelled call
        finished = finished and run.nodes[call.node_id].state not in ENDED
        ends_job = finished and run.is_last_open(call.node_id)  # one script closes both
        if finished:
            close = Close(
                "settle",
                call.tenant_id,
                call.call_id,
                call.prompt_tokens,
                produced,
                run.job_id if ends_job else None,
            )
        else:
            close = Close("release", call.tenant_id, call.call_id)
        if await self.outbox.send(close) is None:
            ends_job = False  # the outbox settles it; the job is finished as it ends
        if ends_job and not run.ended:
            self._finished_in_store.add(run.job_id)
        now = self.clock()
        if not run.ended:
            self.policy.on_finished(call.call_id, call.prompt_tokens, produced, now)
            self._refresh_priorities(call.job_id)  # re-keyed with the truth
        if finished:
            assert last is not None
            run.add_tokens(call.node_id, last.text, tuple(last.token_ids), last_at)
            self.planner.observe(ticket.plan, produced)
            hit_length = last.finish_reason is FinishReason.LENGTH
            run.nodes[call.node_id].hit_length = hit_length
            if hit_length and ticket.plan.cap_reason:
                self._finish_node(run, call.node_id, NodeState.CAPPED, ticket.plan.cap_reason)
            else:
                self._finish_node(run, call.node_id, NodeState.SUCCEEDED, "")
        elif not run.ended:
            reason = failure or ("engine error" if engine_error else "call aborted by the engine")
            self._finish_node(run, call.node_id, NodeState.FAILED, reason)
        self._call_ended(ticket, produced)
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
            self.tasks.start_soon(self._prepare, run, ready)
        if run.ended:
            self._forget(run, now)
        self._wake.set()

    @contextlib.contextmanager
    def _failing_node(self, run: JobRun, node_id: str) -> Iterator[None]:
        """Whatever goes wrong in one call's task fails that call's node, never the loop."""
        try:
            yield
        except Exception:
            log.exception("call %s/%s failed", run.job_id, node_id)
            with contextlib.suppress(Exception):
                self._finish_node(run, node_id, NodeState.FAILED, INTERNAL_ERROR)

    def _withdraw_ready(self, run: JobRun, now: float) -> None:
        """Take a cancelled job's ready calls out of the policy before the job has ended."""
        for ticket in self._drop_tickets(run):
            self._end_unserved(ticket.call.call_id, now)

    def _end_unserved(self, call_id: str, now: float) -> None:
        """A ready call leaves the policy without running: dispatched, and done with nothing."""
        self.policy.mark_dispatched(call_id, now)
        self.policy.on_finished(call_id, 0, 0, now)

    def _drop_tickets(self, run: JobRun) -> list[Ticket]:
        """Forget the job's ready calls; those reserved with the job are released."""
        dropped = [t for t in self.tickets.values() if t.run is run]
        for ticket in dropped:
            call_id = ticket.call.call_id
            del self.tickets[call_id]
            if ticket.held:  # reserved with the job, never dispatched
                self.leases.drop_call(call_id)
                self.tasks.start_soon(self._send, Close("release", run.tenant_id, call_id))
        return dropped

    def _forget(self, run: JobRun, now: float) -> None:
        if self.runs.pop(run.job_id, None) is None:
            return
        self.policy.remove_job(run.job_id, now)
        self._deadlines.discard(run.job_id)
        self.leases.drop_job(run.job_id)
        self._drop_tickets(run)
        span = self._job_spans.pop(run.job_id, None)
        if span is not None:
            span.set_attribute("fairgate.job.state", run.state.value)
            span.end()
        self.on_job_end(run)
        if self.metrics is not None:
            self.metrics.job_ended(run)
        if run.job_id in self._finished_in_store:
            self._finished_in_store.discard(run.job_id)
        else:
            self.tasks.start_soon(self._send, Close("finish_job", run.tenant_id, run.job_id))
        self._wake.set()

    async def _send(self, close: Close) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self.outbox.send(close)
            except Exception:  # never the loop's end; the store reclaims it one lease later
                log.exception("quota close %s failed", close.key)

