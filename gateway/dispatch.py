"""The dispatch loop: it performs what the dispatch core decides, on the pool's backends.

Jobs are admitted against the tenant's quotas, then join the fair-share policy through the core
(`gateway.dispatch_core`); a node whose parents are done is rendered and tokenized
(`gateway.intake`) and handed to the core as a ready call. Each pass asks the core for the next
call with the backends' capacity snapshots: the core answers in policy order, only while some
backend can admit the call now, and says which one, so the backends' own queues stay short and
the policy's order is the order that runs.

A taken call of a pool shared with other replicas is first granted by the pool's fair share in
Redis (`gateway.share_exchange`; made to wait, its tenant is held a moment while others go
on). A taken call then reserves its worst case (prompt + max_tokens) in the quota store, in a
task of its own so that no slow store reply stalls the loop: meanwhile the policy holds it (it stays
ready, unseen) and its room is promised. A reserve that cannot reach the store is retried with
backoff until `reserve_deadline_s`; a quota refusal with a retry time holds the call's tenant
in the policy until then (or until one of its calls ends), so other tenants go on. A reserved
call is marked dispatched and started; a follower task streams its tokens into the job and, when
it ends, settles (or releases) the reservation exactly once through the outbox, tells the
core what it really cost, and releases dependents. A call lost with its backend (`BackendLost`)
is released and runs again once from its prompt, its node back to READY with its output
cleared (the lost-call rule); lost twice, it fails. A sheddable call the core chooses to yield
its room to a waiting call of another job is aborted and goes the same way, as often as it
yields (its aborted attempt is released: the tenant is not charged for work thrown away).
A call that ends while its job is `fenced` (this replica's lease on it may have lapsed, by the
journaling's clock: another replica may be running the node) goes the same way, not settled,
and the fenced job is held (no call of it is sent) until `lease_renewed` finds it unfenced. The
journaling's timer tells `job_fenced` as the deadline passes: the job is held then and its
running calls are aborted on their backends (their work would be thrown away, beside the next
owner's), going the same way; one so aborted goes so even if a renewal lands before its end is
seen (it runs again here at once: the renewal unheld the job).
Reservations and admitted jobs are leases that `Leases` renews while they run. Plans that
change once made (a call refined from its prompt's hidden state, a tenant's ready calls of a kind
the error tracker turns conservative) are `gateway.replanning`'s. A one-call job that the
engine would take at once reserves its call in the same script as its admission, and a job's
last call finishes the job in the same script as its settle.

Isolation: every task of one call (its preparation, its reserve, its follower) catches what it
raises and fails that call's node only; nothing a call does can end the loop.

Invariant: every reservation is settled or released exactly once (directly or through the
outbox), in a `finally` shielded from cancellation; a call is settled exactly when its node ends
SUCCEEDED or CAPPED (a cancel that comes once its end is seen is too late for it), or when the
tenant's side cancels it after its node took a token (for the tokens its node took); one held
from admission but never dispatched is released when its job ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup
from opentelemetry import trace

from engine import FinishReason, TokenDelta
from gateway.backends import (
    BackendCall,
    BackendCapacity,
    BackendLost,
    BackendRefused,
    CallStream,
)
from gateway.calls import CallPlanner, CallRefused
from gateway.charge import charge
from gateway.core_call import CoreCall
from gateway.deadlines import Deadlines
from gateway.dispatch_core import DispatchCore
from gateway.errors import Overloaded, ShareUnavailable
from gateway.intake import Admitted, Intake, Planned
from gateway.job_run import ENDED, JobRun, JobState, NodeState
from gateway.jobs import MAX_QUEUED_CHARS
from gateway.lanes import Lane
from gateway.leases import Leases, reserve_within, retry_unavailable
from gateway.metrics import GatewayMetrics
from gateway.outbox import Close, Outbox
from gateway.overload import OverloadControl
from gateway.owned import OwnsTasks
from gateway.prompts import PromptEncoder
from gateway.replanning import Replanning
from gateway.share import Ask, RedisShare
from gateway.share_exchange import ShareExchange
from gateway.slo import SloConfig
from gateway.spans import annotate_call, call_span, end_job_span, start_job_span
from gateway.tickets import Ticket, part_of
from tenants import (
    CallClosed,
    QuotaExceeded,
    QuotaLimit,
    QuotaStore,
    QuotaUnavailable,
    TenantNotFound,
    TenantQuota,
)
from tenants.policies import JobInfo

log = logging.getLogger(__name__)
INTERNAL_ERROR = "internal error"
BACKEND_LOST = "backend lost"
# to a protected job's call (overload), or to an under-share tenant's (share_slots)
YIELDED = "yielded its slot to another job's waiting call"
FENCED = "its job's lease may have lapsed"  # another replica may run the node: not charged here
BLOCKED_RETRY_S = 0.05  # how often a pass is retried while a ready call waits for room
GRANT_RETRY_S = 0.025  # a call the pool's share made wait asks again after this long
POOL_DOWN_RETRY_S = 5.0  # what a job refused for a pool that does not serve is told to wait
Entry = CoreCall[Ticket]


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    reservation_ttl_s: float = 60.0  # lease of a reservation or an admitted job, renewed
    reserve_deadline_s: float = 30.0  # how long a reserve retries an unreachable store
    max_prompt_chars: int = 262_144  # bound on a rendered prompt, checked before rendering
    # bound on the characters a tenant's jobs here hold (`JobRun.chars`); 0: none
    max_queued_chars: int = MAX_QUEUED_CHARS
    cache_salt_per_tenant: bool = False  # tenants never share prefix-cache blocks
    # a new job that needs a pool none of whose backends has served for this long is refused
    pool_down_after_s: float = 10.0


class Dispatcher(OwnsTasks):
    def __init__(
        self,
        lanes: Sequence[Lane],
        store: QuotaStore,
        planner: CallPlanner,
        config: DispatchConfig,
        clock: Callable[[], float] = time.time,
        on_job_end: Callable[[JobRun], None] = lambda run: None,
        tracer: trace.Tracer | None = None,
        outbox: Outbox | None = None,
        metrics: GatewayMetrics | None = None,
        slo: SloConfig | None = None,
        share: RedisShare | None = None,
    ) -> None:
        super().__init__()
        if share is None and any(lane.core.gated for lane in lanes):
            raise ValueError("a gated lane needs the pool's share")
        names = [name for lane in lanes for name in lane.backends]
        if not lanes or len(set(names)) != len(names) or len({x.model for x in lanes}) < len(lanes):
            raise ValueError("one lane per model, backend names unique across them")
        self.metrics = metrics
        self.lanes = {lane.model: lane for lane in lanes}  # the default model's first
        self.default_model = lanes[0].model
        self.models = frozenset(self.lanes)
        self.backends = {n: b for lane in lanes for n, b in lane.backends.items()}
        self.store = store
        self.planner = planner
        self.config = config
        self.clock = clock
        self.on_job_end = on_job_end
        self.outbox = outbox if outbox is not None else Outbox(store)
        self.leases = Leases(store, config.reservation_ttl_s)
        self.streams: dict[str, CallStream] = {}  # running call id -> its backend's stream
        self.runs: dict[str, JobRun] = {}  # active jobs
        self._active: Counter[str] = Counter()  # per tenant, its jobs in `runs`
        self._chars: Counter[str] = Counter()  # per tenant, its jobs' `chars` in `runs`
        self._quotas: dict[str, TenantQuota] = {}
        self._wake = anyio.Event()
        self._closing = 0  # tasks of calls under way (taken, followed, closed): `wait_calls_closed`
        self._calls_closed = anyio.Event()  # set, and replaced, as the last of them ends
        self._tracer = tracer  # None: no spans
        self._job_spans: dict[str, trace.Span] = {}
        self._finished_in_store: set[str] = set()  # jobs whose last settle finished them
        self._deadlines = Deadlines(clock, self._expire)
        self.intake = Intake(self.lanes, self.default_model, planner)
        self.replanning = Replanning(self.lanes, planner, clock, self._start_soon)
        self.paused = False
        # whether another replica may own the job now (the journaling's self-fence): a call of
        # it is neither charged nor started here; never without a journal
        self.fenced: Callable[[JobRun], bool] = lambda run: False
        self._held_fenced: dict[str, JobRun] = {}  # jobs held for it, until `lease_renewed`
        # this replica's side of the pools' fair shares across replicas (the gated lanes')
        self.exchange: ShareExchange | None = None
        if share is not None:
            self.exchange = ShareExchange(share, clock, lambda: self.paused, metrics)
        self.overload = None  # no SLO targets: no overload control
        if slo is not None:
            self.overload = OverloadControl(slo, lanes, clock, self._wake_loop, metrics)

    def _start_soon(self, func: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        self.tasks.start_soon(func, *args)

    def _wake_loop(self) -> None:
        self._wake.set()

    def _start_call_task(self, func: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Start a task of a call under way, or one that sends a quota close: counted from now
        (before it first runs) until it ends, for `wait_calls_closed`."""
        self.tasks.start_soon(self._counted, func, *args)  # runs later: counted first all the same
        self._closing += 1

    async def _counted(self, func: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        try:
            await func(*args)
        finally:
            self._closing -= 1
            if not self._closing:
                self._calls_closed.set()
                self._calls_closed = anyio.Event()

    async def wait_calls_closed(self) -> None:
        """Return once no call is under way here: every call taken has been sent and has
        ended, and what it reserved (or its job held for it) has been settled or released,
        as has every ended job's admission (landed, or pending in the outbox:
        `Outbox.wait_drained`).

        A cancel returns before its calls' followers have seen their ends and closed them:
        whoever must know the quota is closed (a test of a cancel's charge, a shutdown that
        lets what it aborted settle) waits here rather than looking again and again.
        """
        while self._closing:
            await self._calls_closed.wait()

    def lease_renewed(self) -> None:
        """A lease renewal landed: the held jobs it unfenced start calls again."""
        for job_id, run in list(self._held_fenced.items()):
            if not self.fenced(run):
                del self._held_fenced[job_id]
                for lane in self.intake.lanes_of(run):
                    lane.core.unhold_job(job_id)
                self._wake.set()

    def job_fenced(self, run: JobRun) -> None:
        """The job's fencing deadline passed (no renewal landed in time): it is held, and its
        running calls are aborted on their backends (another replica may be running them):
        each follower releases its attempt and sends its node back to READY (`_follow`)."""
        if run.job_id not in self.runs or not self.fenced(run):
            return
        self._hold_fenced(run)
        for node_id in run.nodes:
            entry = self._running(run, node_id)
            if entry is not None:
                entry.payload.fenced_off = True
                self.backends[entry.backend].abort(entry.call.call_id)

    def _hold_fenced(self, run: JobRun) -> None:
        """A fenced job starts no call until a renewal finds it this replica's still (a call
        started now might run beside the new owner's, and would be released at its end)."""
        if run.job_id not in self._held_fenced:
            self._held_fenced[run.job_id] = run
            for lane in self.intake.lanes_of(run):
                lane.core.hold_job(run.job_id)

    def room_changed(self) -> None:
        """A backend shows new room (a scrape landed): a call waiting for room looks again."""
        if any(lane.core.blocked for lane in self.lanes.values()):
            self._wake.set()

    @property
    def core(self) -> DispatchCore[Ticket]:
        """The default model's dispatch core."""
        return self.lanes[self.default_model].core

    def encoder(self, model: str = "") -> PromptEncoder:
        """The prompt encoder of a model's pool (the default model's for "")."""
        return self.lanes[model or self.default_model].tickets.encode

    def quota(self, tenant_id: str) -> TenantQuota | None:
        """The quota the tenant's latest job was admitted with (its weight is the policy's)."""
        return self._quotas.get(tenant_id)

    def ready_calls(self) -> int:
        return sum(len(lane.core.ready) for lane in self.lanes.values())

    def refuse_if_down(self, run: JobRun) -> None:
        """Overloaded when a pool the job needs has had no backend serving for
        `pool_down_after_s`: the job would only wait (jobs admitted before wait on, and run
        when a backend is back)."""
        for lane in self.intake.lanes_of(run):
            down = lane.down_for()
            if down is not None and down >= self.config.pool_down_after_s:
                raise Overloaded(
                    f"no backend of model {lane.model!r} has served for {down:.0f} s: new jobs"
                    " are refused until one does",
                    POOL_DOWN_RETRY_S,
                    reason="BACKENDS_UNAVAILABLE",
                )

    def _lane(self, ticket: Ticket) -> Lane:
        return self.lanes[ticket.model_name]

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        await stack.enter_async_context(self.outbox)
        await stack.enter_async_context(self.leases)
        if self.exchange is not None:
            # once the tasks have ended (every aborted call's grant trued up in its core), so
            # that a replica shut down leaves no grant charged at its worst case
            stack.push_async_callback(self.exchange.close, list(self.lanes.values()))

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._loop)
        tg.start_soon(self._deadlines.run)
        if self.overload is not None:
            tg.start_soon(self.overload.run)
        if self.exchange is not None:
            tg.start_soon(self.exchange.publish_forever, self.lanes.values())

    def capacities(self) -> dict[str, BackendCapacity]:
        """Every backend's room, across the pools."""
        return {name: backend.capacity() for name, backend in self.backends.items()}

    async def admit(self, run: JobRun, quota: TenantQuota) -> Admitted:
        """Admit a job in the quota store (raises its refusals); `submit` it next. A one-call
        job that the pool would take at once has its call reserved in the same script."""
        intake = self.intake
        blanks = await intake.blanks(run)
        info = await intake.job_info(run, quota, self.clock(), blanks)
        roots = await intake.plan_roots(run, run.dag.roots(), quota, blanks)
        ticket = intake.ticket_to_hold(run, roots)
        admitted = Admitted(info, roots, ticket)
        try:
            await self._admit_in_store(run, ticket)
        except (QuotaUnavailable, anyio.get_cancelled_exc_class()):
            # the script may have run (or still run once the store answers), though nobody
            # will submit the job: its client left, or the store's reply never came
            with anyio.CancelScope(shield=True):
                await self.undo_admit(run, admitted)
            raise
        return admitted

    async def undo_admit(self, run: JobRun, admitted: Admitted) -> None:
        """Undo an admission that will not be submitted (its call's reservation included)."""
        if admitted.ticket is not None:
            await self.outbox.send(Close("release", run.tenant_id, admitted.ticket.quota_id))
        await self.outbox.send(Close("finish_job", run.tenant_id, run.job_id))

    async def _admit_in_store(self, run: JobRun, ticket: Ticket | None) -> None:
        ttl = self.config.reservation_ttl_s
        if ticket is None:
            await self.store.admit_job(run.tenant_id, run.job_id, len(run.nodes), ttl_s=ttl)
            return
        held = await self.store.admit_job_and_reserve(
            run.tenant_id,
            run.job_id,
            len(run.nodes),
            ticket.quota_id,
            ticket.quota_tokens,
            ttl,
            ttl_s=ttl,
        )
        ticket.held = held is not None

    def submit(self, run: JobRun, quota: TenantQuota, admitted: Admitted) -> None:
        """Add an admitted job: it joins the policy and its roots become ready (a root the
        planner refused fails), in one step of the loop."""
        now = self.clock()
        self._add_job(run, admitted.info, now, set(run.nodes))  # nothing kept if it refuses
        self._track(run, quota, admitted.info)
        ticket = admitted.ticket
        if ticket is not None and ticket.held:
            self.leases.hold_call(run.tenant_id, ticket.quota_id)
        for node_id in run.start(now):
            self._add_planned(run, node_id, admitted.roots[node_id])
        self._wake.set()

    async def resume(self, run: JobRun, quota: TenantQuota) -> None:
        """Run on a job that another replica started (taken over from the journal): its ended
        nodes stay as they are, a node that was running runs again from its prompt (the
        lost-call rule: its partial output is cleared), the others go as usual; a job journaled
        and no more (its replica stopped before its roots were ready) starts here. Raises the
        store's refusals (its admission is idempotent by job id)."""
        now = self.clock()
        for node_id, node in run.nodes.items():
            if node.state is NodeState.RUNNING:
                run.retry_node(node_id, now, f"{BACKEND_LOST} with its replica: running again")
        blanks = await self.intake.blanks(run)
        # it arrived when its client submitted it: first come, first served keeps its place
        info = await self.intake.job_info(run, quota, run.created_at, blanks)
        # the roots ready once it is added: a running one runs again, and nothing else moves
        # a node of a job not yet added here (a cancel ends the job)
        waiting = [n for n in run.dag.roots() if run.nodes[n].state not in ENDED]
        roots = await self.intake.plan_roots(run, waiting, quota, blanks)
        if run.ended or run.detached:  # cancelled, or lost again, while it was being read
            return
        await self._admit_in_store(run, None)
        if run.detached:  # lost again: the admission (by job id) is its next owner's
            return
        if run.ended:  # its cancel came while it was admitted: nothing else will finish it
            self._start_call_task(self._send, Close("finish_job", run.tenant_id, run.job_id))
            return
        try:
            self._add_job(run, info, now, {n for n, r in run.nodes.items() if r.state not in ENDED})
            self._track(run, quota, info)
        except BaseException:  # admitted, but it will not run here: nothing else finishes it
            self._start_call_task(self._send, Close("finish_job", run.tenant_id, run.job_id))
            raise
        if run.state is JobState.QUEUED:  # its first owner stopped before it started it
            run.start(now)
        for node_id, node in run.nodes.items():
            if node.state is not NodeState.READY:
                continue
            if run.dag.parents[node_id]:  # its prompt holds its parents' outputs
                self.tasks.start_soon(self._prepare, run, node_id)
            else:  # its prompt is its blank, as when it was submitted
                self._add_planned(run, node_id, roots[node_id])
        self._wake.set()

    def _add_job(self, run: JobRun, info: JobInfo, now: float, nodes: set[str]) -> None:
        """The job joins the policy of each pool it runs in, with its `nodes` there."""
        added: list[Lane] = []
        try:
            for lane in self.intake.lanes_of(run):
                mine = {n for n in nodes if self.intake.lane_of(run, n) is lane}
                if not mine:
                    continue
                lane.core.add_job(part_of(info, mine), now)
                added.append(lane)
        except Exception:
            for lane in added:
                lane.core.remove_job(run.job_id, now)
            raise

    def _track(self, run: JobRun, quota: TenantQuota, info: JobInfo) -> None:
        """An added job is held: its admission's lease, its deadline, its span."""
        self._quotas[run.tenant_id] = quota
        if self.metrics is not None:
            self.metrics.admitted(run.tenant_id)
        self.runs[run.job_id] = run
        self._active[run.tenant_id] += 1
        self._chars[run.tenant_id] += run.chars
        self.leases.hold_job(run.tenant_id, run.job_id)
        if run.spec.deadline_unix_s is not None:
            self._deadlines.add(run.job_id, run.spec.deadline_unix_s)
        if self._tracer is not None:
            self._job_spans[run.job_id] = start_job_span(self._tracer, run, info)

    def active_jobs(self, tenant_id: str) -> int:
        """The tenant's jobs this replica holds (at most its admitted ones, which the store
        counts across replicas)."""
        return self._active[tenant_id]

    def held_chars(self, tenant_id: str) -> int:
        """The characters the tenant's jobs this replica holds hold (`JobRun.chars`)."""
        return self._chars[tenant_id]

    def running_jobs(self) -> list[JobRun]:
        """Jobs that have not ended."""
        return [r for r in self.runs.values() if not r.ended]

    def cancel(
        self, run: JobRun, reason: str = "cancelled", *, failed: bool = False, charge: bool = False
    ) -> None:
        """Cancel a job: running calls are aborted; their followers settle what they made when
        `charge` (the tenant's side ended it: `JobRun.charge_cut_short`), else release their
        quota. `failed` ends the job FAILED instead of CANCELLED."""
        if run.ended:
            return
        now = self.clock()
        for node_id in run.cancel(now, reason, failed=failed, charge=charge):
            self._abort(run, node_id)
        if run.ended:
            self._forget(run, now)
        else:  # a finished call is being settled: the job ends with it
            for lane in self.intake.lanes_of(run):
                self._release_held(lane.core.withdraw_unsent(run.job_id, now))

    def _abort(self, run: JobRun, node_id: str) -> None:
        entry = self._running(run, node_id)
        if entry is not None:
            self.backends[entry.backend].abort(entry.call.call_id)

    def _running(self, run: JobRun, node_id: str) -> Entry | None:
        """The node's call, while the core counts it running (sent, not yet closed)."""
        return self.intake.lane_of(run, node_id).core.running.get(f"{run.job_id}/{node_id}")

    def _expire(self, job_id: str) -> None:
        run = self.runs.get(job_id)
        try:
            if run is not None:
                self.cancel(run, "deadline exceeded", failed=True, charge=True)
        except Exception:  # the deadline timer serves every job: it must go on
            log.exception("expiring %s", job_id)

    def _add_planned(self, run: JobRun, node_id: str, planned: Planned) -> None:
        """A ready node's call joins the policy; a refused one fails its node. A root planned
        as its job was admitted is planned as it would be now (`Replanning.widen`) if its kind
        turned conservative while the admission awaited the store (`widen_kind` found it in no
        ready calls)."""
        if isinstance(planned, CallRefused):
            self._finish_node(run, node_id, NodeState.FAILED, str(planned))
            return
        self.replanning.widen(planned)
        self._add_ready(planned, self.clock())

    def _add_ready(self, ticket: Ticket, now: float) -> None:
        core = self._lane(ticket).core
        sheddable = ticket.run.spec.sheddable
        core.add_ready(ticket.call, ticket.plan.reserve_output, ticket, now, ticket.held, sheddable)

    async def _prepare(self, run: JobRun, node_id: str) -> None:
        """Render and encode a node whose parents are done, then make it ready; a prompt over
        the bound fails the node before any of it is rendered, and so does one whose parents'
        outputs would take its tenant's jobs here past `max_queued_chars` (`_hold_outputs`)."""
        with self._failing_node(run, node_id):
            try:
                self._hold_outputs(run, node_id)
                encoded = await self.intake.encode_node(run, node_id, self.config.max_prompt_chars)
            except CallRefused as exc:
                self._finish_node(run, node_id, NodeState.FAILED, str(exc))
                return
            if run.nodes[node_id].state is NodeState.READY:  # not cancelled meanwhile
                quota = self._quotas[run.tenant_id]
                self._add_planned(run, node_id, self.intake.plan(run, node_id, quota, encoded))
                self._wake.set()

    def _hold_outputs(self, run: JobRun, node_id: str) -> None:
        """Count what the node's parents' outputs add to its prompt among the characters its
        job holds: admission counted the prompt with them empty (`job_chars`), and children
        that each repeat a parent's output (128 of them, 15 times a 2 KB output) held megabytes
        a job counted as nothing, and a tenant's jobs gigabytes. CallRefused past the bound."""
        grown = self.intake.outputs_chars(run, node_id)
        limit, held = self.config.max_queued_chars, self._chars[run.tenant_id]
        if 0 < limit < held + grown:
            raise CallRefused(
                f"with its parents' outputs, its tenant's jobs here would hold {held + grown:,}"
                f" characters; at most {limit:,}"
            )
        run.chars += grown
        self._chars[run.tenant_id] += grown

    async def _loop(self) -> None:
        while True:
            # A landed scrape or a call's end wakes the loop, but room can come back with no
            # event (a circuit breaker's cooldown ends): while a call waits for room the loop
            # looks again each BLOCKED_RETRY_S as well
            blocked = any(lane.core.blocked for lane in self.lanes.values())
            with anyio.move_on_after(BLOCKED_RETRY_S if blocked else math.inf):
                await self._wake.wait()
            self._wake = anyio.Event()
            try:
                self._dispatch_ready()
            except Exception:  # a policy bug must not end the gateway: the next wake retries
                log.exception("dispatch pass failed")

    def pause(self) -> None:
        """Start no more calls (the replica is handing its jobs over)."""
        self.paused = True

    @property
    def settling(self) -> bool:
        """Whether some call has ended and is being settled (a cancel is too late for it)."""
        return any(run.finishing for run in self.runs.values())

    def _dispatch_ready(self) -> None:
        if self.paused:
            return
        for lane in self.lanes.values():
            granting = False  # a grant asked now carries the heads as they are when it goes
            while (dispatch := lane.core.next(self.clock(), lane.capacities())) is not None:
                entry = dispatch.entry
                if dispatch.taken:
                    granting |= dispatch.needs_grant
                    self._start_call_task(self._take, entry, dispatch.needs_grant)
                else:
                    self._start(entry)
            for victim in lane.core.to_yield(self.clock(), lane.capacities()):
                self.backends[victim.backend].abort(victim.call.call_id)
            if self.exchange is not None:
                self.exchange.pass_ended(lane, granting)

    async def _take(self, entry: Entry, grant: bool) -> None:
        """A taken call: granted by the pool's share (`grant`), its quota reserved (unless it
        was with its job's admission), then started."""
        ticket = entry.payload
        call, run, core = ticket.call, ticket.run, self._lane(ticket).core
        with self._failing_node(run, call.node_id):
            try:
                deadline = self.clock() + self.config.reserve_deadline_s
                if run.spec.deadline_unix_s is not None:
                    deadline = min(deadline, run.spec.deadline_unix_s)
                # its job may have ended before this task ran: nothing to ask for (what its
                # job's admission reserved for it was released as the job ended)
                gone = call.call_id not in core.taking
                if grant and not gone and not await self._grant(entry, deadline):
                    return
                # (a cancel may have dropped it during the grant: nothing to reserve then)
                reserving = not entry.reserved and call.call_id in core.taking
                if reserving:
                    await reserve_within(
                        self.store,
                        call.tenant_id,
                        ticket.quota_id,
                        ticket.quota_tokens,
                        self.config.reservation_ttl_s,
                        deadline,
                        self.clock,
                    )
            except QuotaExceeded as exc:
                self._refused(entry, exc)
                return
            except (QuotaUnavailable, ShareUnavailable) as exc:
                # the reserve may have landed after all: close it
                await self._send(Close("release", call.tenant_id, ticket.quota_id))
                what = "quota store" if isinstance(exc, QuotaUnavailable) else "fair-share store"
                self._drop_ready(entry, f"{what} unavailable")
                return
            except (CallClosed, TenantNotFound) as exc:
                self._drop_ready(entry, str(exc))
                return
            finally:
                self._wake.set()  # its promised room is free again, or it runs now
            if core.launched(call.call_id, self.clock()) is None:
                # its job ended meanwhile, which released a reserve made with its admission;
                # the one made here is this task's to release
                if reserving:
                    await self._send(Close("release", call.tenant_id, ticket.quota_id))
                return
            self.leases.hold_call(call.tenant_id, ticket.quota_id)
            self._start(entry)

    async def _grant(self, entry: Entry, deadline: float) -> bool:
        """Ask the pool's share for the call, retrying an unreachable store until `deadline`;
        False when it must wait (it is ready again, its tenant held a moment)."""
        ticket = entry.payload
        call, lane = ticket.call, self._lane(ticket)
        assert self.exchange is not None, "a gated lane needs the pool's share"
        exchange = self.exchange
        ask = Ask(call.tenant_id, lane.core.charge(entry), lane.core.offset(entry, self.clock()))
        grant = await retry_unavailable(
            lambda: exchange.exchange(lane, ask), ShareUnavailable, deadline, self.clock
        )
        if grant:
            lane.core.granted(call.call_id, ask.tenant_id, ask.charge, grant.key)
            return True
        lane.core.retry_later(call.call_id, self.clock() + GRANT_RETRY_S, quota=False)
        self.replanning.widen_call(ticket)
        self.tasks.start_soon(self._wake_after, GRANT_RETRY_S)
        if self.metrics is not None:
            self.metrics.share_waited(call.tenant_id)
        return False

    def _refused(self, entry: Entry, exc: QuotaExceeded) -> None:
        """A quota refused the call: it waits, its tenant held, or fails when waiting is vain."""
        call, core = entry.call, self._lane(entry.payload).core
        if self.metrics is not None:
            self.metrics.refused(call.tenant_id, exc.reason)
        if call.call_id not in core.taking:
            return  # its job ended meanwhile
        if exc.retry_after_s is None or exc.limit is QuotaLimit.DAILY_BUDGET:
            self._drop_ready(entry, str(exc))
            return
        delay = max(exc.retry_after_s, 0.01)
        core.retry_later(call.call_id, self.clock() + delay)
        self.replanning.widen_call(entry.payload)
        self.tasks.start_soon(self._wake_after, delay)

    async def _wake_after(self, delay: float) -> None:
        await anyio.sleep(delay)
        self._wake.set()

    def _drop_ready(self, entry: Entry, reason: str) -> None:
        """Fail a call that never reached a backend: the policy sees it end unserved."""
        ticket = entry.payload
        self._lane(ticket).core.drop(entry.call.call_id, self.clock())
        self._finish_node(ticket.run, entry.call.node_id, NodeState.FAILED, reason)
        self._call_ended(ticket, 0)

    def _first_token(self, entry: Entry) -> None:
        """The SLO monitor judges the call's wait for the gateway, from ready (or from its
        tenant's quota releasing it, as it was when the call was sent) to its first token."""
        ticket = entry.payload
        ready_at = ticket.run.nodes[ticket.call.node_id].ready_at
        if self.overload is not None and ready_at is not None:
            since = self._lane(ticket).core.book.waiting_since(entry, ready_at)
            self.overload.first_token(ticket, max(self.clock() - since, 0.0))

    def _call_ended(
        self,
        ticket: Ticket,
        produced: int,
        settled: int | None = None,
        last_token_at: float | None = None,
    ) -> None:
        """`settled`: the output tokens its quota settled (None: released); `last_token_at`:
        when a finished call's last tokens came, where its per-token time and run time end
        (its node ends after the settle: the store's round trip is no backend's time)."""
        node = ticket.run.nodes[ticket.call.node_id]
        times = node.times(produced, last_token_at)
        if self.overload is not None and node.started_at is not None:  # it held a slot
            self.overload.ended(ticket, times.tpot)
        if self.metrics is not None:
            tenant, conservative = ticket.call.tenant_id, ticket.plan.conservative
            model = ticket.model_name
            self.metrics.call_ended(tenant, node, produced, times, conservative, model, settled)

    def _start(self, entry: Entry) -> None:
        """Send a dispatched call to its backend; a call the backend refuses fails alone, one
        of a fenced job is set aside unsent."""
        ticket = entry.payload
        call = ticket.call
        if self.fenced(ticket.run):
            self._set_aside(entry)
            return
        backend = self.backends[entry.backend]
        try:
            stream = backend.submit(
                BackendCall(
                    call.call_id,
                    ticket.prompt_ids,
                    ticket.plan.params,
                    entry.priority,
                    ticket.plan.reserve_output,
                    call.tenant_id if self.config.cache_salt_per_tenant else "",
                    ticket.quota_id,  # each attempt's own, as in the quota store
                )
            )
        except Exception as exc:
            log.warning("backend %s refused %s: %s", backend.name, call.call_id, exc)
            self._start_call_task(self._close_unstarted, entry, str(exc))
            return
        self.streams[call.call_id] = stream
        ticket.run.mark_running(call.node_id, call.prompt_tokens, self.clock())
        self._start_call_task(self._follow, entry, stream)

    def _set_aside(self, entry: Entry) -> None:
        """A call of a fenced job, dispatched but not sent: ready again (no attempt spent), its
        reservation released, its job held."""
        ticket = entry.payload
        if self._lane(ticket).core.yielded(ticket.call.call_id, self.clock()) is None:
            self._start_call_task(self._close_unstarted, entry, FENCED)  # its job left the core
            return
        self._next_attempt(ticket)
        self.replanning.widen_call(ticket)
        self._hold_fenced(ticket.run)

    def _next_attempt(self, ticket: Ticket) -> None:
        """The attempt's reservation is released; the next reserves under a fresh quota id (a
        late release of this one cannot touch the next's)."""
        self.leases.drop_call(ticket.quota_id)
        self._start_call_task(self._send, Close("release", ticket.call.tenant_id, ticket.quota_id))
        ticket.held = False
        ticket.fenced_off = False
        ticket.attempt += 1

    async def _close_unstarted(self, entry: Entry, reason: str) -> None:
        ticket = entry.payload
        call = ticket.call
        with anyio.CancelScope(shield=True), self._failing_node(ticket.run, call.node_id):
            self.leases.drop_call(ticket.quota_id)
            await self._send(Close("release", call.tenant_id, ticket.quota_id))
            core = self._lane(ticket).core
            self.replanning.reprioritize(
                core.finished(call.call_id, call.prompt_tokens, 0, self.clock())
            )
            self._finish_node(ticket.run, call.node_id, NodeState.FAILED, reason)
            self._call_ended(ticket, 0)

    async def _follow(self, entry: Entry, stream: CallStream) -> None:
        ticket = entry.payload
        call, run = ticket.call, ticket.run
        last: TokenDelta | None = None
        last_at = 0.0
        produced = 0
        failure = ""  # why following the call failed, if it did
        lost = False
        with self._call_span(entry) as span:
            try:
                async for delta in stream:
                    if not produced and delta.token_ids:
                        self._first_token(entry)
                    produced += len(delta.token_ids)
                    last_at = self.clock()
                    if not delta.finished:  # the last tokens join the job with the call's end
                        run.add_tokens(call.node_id, delta.text, tuple(delta.token_ids), last_at)
                    self._progress(entry, delta, produced)
                    last = delta
                    if delta.finished and delta.finish_reason is not FinishReason.ERROR:
                        run.finishing.add(call.node_id)  # a cancel from now on is too late
            except BackendLost as exc:
                log.warning("backend %s lost %s: %s", entry.backend, call.call_id, exc)
                lost, failure = True, BACKEND_LOST
            except BackendRefused as exc:  # the server's answer about this call: it says why
                log.info("backend %s refused %s: %s", entry.backend, call.call_id, exc)
                failure = f"backend refused: {exc}"
            except Exception:
                log.exception("following %s", call.call_id)
                failure = INTERNAL_ERROR
            finally:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()  # aborts the call if it has not finished
                    ended = last is not None and last.finished
                    again = YIELDED if entry.yielding and not ended else ""
                    again = again or (BACKEND_LOST if lost else "")
                    # after the stream's end, before any settle; an attempt aborted as fenced
                    # goes so even if a renewal has landed since
                    if self.fenced(run) or (ticket.fenced_off and not ended):
                        again = failure = FENCED
                    with self._failing_node(run, call.node_id):
                        if not (again and self._run_again(entry, again)):
                            if stream.usage is not None:  # the backend's count is the truth
                                produced = stream.usage.completion_tokens
                            await self._close_call(entry, last, last_at, produced, failure)
                    if span is not None:
                        annotate_call(span, ticket, last, produced)

    def _run_again(self, entry: Entry, why: str) -> bool:
        """The lost-call rule (`why` BACKEND_LOST, or FENCED: whoever owns the job next runs
        it, this replica once renewed) or a yield (YIELDED): the attempt's reservation is
        released and the call runs again from its prompt under a fresh quota id (a late release
        of an attempt cannot touch the next's); False when it cannot (lost twice, or
        cancelled): it ends as it is."""
        ticket = entry.payload
        call, run = ticket.call, ticket.run
        if run.nodes[call.node_id].state is not NodeState.RUNNING or run.cancelling:
            return False
        core, now = self._lane(ticket).core, self.clock()
        again = core.lost if why == BACKEND_LOST else core.yielded  # a fenced end is no loss
        if again(call.call_id, now) is None:
            return False
        self.streams.pop(call.call_id, None)
        self._next_attempt(ticket)
        self.replanning.widen_call(ticket)
        run.finishing.discard(call.node_id)
        run.retry_node(call.node_id, now, f"{why}: running again")
        if why == YIELDED and self.metrics is not None:  # counted once it runs again: a call
            self.metrics.yielded(call.tenant_id)  # whose answer had come keeps it, no yield
        if why == FENCED and self.fenced(run):  # unless a renewal landed since its abort
            self._hold_fenced(run)
        self._wake.set()
        return True

    def _progress(self, entry: Entry, delta: TokenDelta, produced: int) -> None:
        ticket = entry.payload
        if delta.hidden is not None and ticket.plan.refinable and not ticket.run.ended:
            self.replanning.refine(entry, delta.hidden)
        if not ticket.overran and ticket.plan.past_p90(produced):
            ticket.overran = True
            if self.planner.overran(ticket.plan, produced):
                self.replanning.widen_kind(ticket)
        core = self._lane(ticket).core
        self.replanning.reprioritize(core.progress(ticket.call.call_id, produced, self.clock()))

    def _call_span(self, entry: Entry) -> contextlib.AbstractContextManager[trace.Span | None]:
        """The call's `chat <model>` span under its job's span; nothing when not tracing."""
        if self._tracer is None:
            return contextlib.nullcontext()
        job_span = self._job_spans.get(entry.payload.run.job_id)
        backend = self.backends[entry.backend]
        return call_span(self._tracer, job_span, entry.payload, backend, entry.priority)

    async def _close_call(
        self,
        entry: Entry,
        last: TokenDelta | None,
        last_at: float,
        produced: int,
        failure: str = "",
    ) -> None:
        """Settle or release the call (`gateway.charge` says which), then end its node. A
        finished call's last tokens are added only now, after the settle, next to the node's end
        (and the job's, if it was the last call): whoever watches the job gets them in one
        wake-up. A call that failed here (`failure`) or in its backend fails its node."""
        ticket = entry.payload
        call, run = ticket.call, ticket.run
        self.streams.pop(call.call_id, None)
        self.leases.drop_call(ticket.quota_id)
        cost = charge(run, call, ticket.quota_id, last, produced, failure)
        ends_job = cost.close.finish_job is not None  # one script settles and finishes it
        if await self.outbox.send(cost.close) is None:
            ends_job = False  # the outbox settles it; the job is finished as it ends
        if ends_job and not run.ended:
            self._finished_in_store.add(run.job_id)
        now, core = self.clock(), self._lane(ticket).core
        self.replanning.reprioritize(core.finished(call.call_id, call.prompt_tokens, produced, now))
        if cost.finished:
            assert last is not None
            run.add_tokens(call.node_id, last.text, tuple(last.token_ids), last_at)
            self._observe(entry, produced, last_at)
            hit_length = last.finish_reason is FinishReason.LENGTH
            run.nodes[call.node_id].hit_length = hit_length
            if hit_length and ticket.plan.cap_reason:
                self._finish_node(run, call.node_id, NodeState.CAPPED, ticket.plan.cap_reason)
            else:
                self._finish_node(run, call.node_id, NodeState.SUCCEEDED, "")
        elif not run.ended:
            self._finish_node(run, call.node_id, NodeState.FAILED, cost.reason)
        self._call_ended(ticket, produced, cost.settled, last_at if cost.finished else None)
        self._wake.set()

    def _observe(self, entry: Entry, produced: int, last_at: float) -> None:
        """A call finished, its last tokens at `last_at` (its node ends after its settle): the
        predictor learns its length (its kind may turn conservative), the router its backend's
        speed."""
        ticket = entry.payload
        if self.planner.observe(ticket.plan, produced, ticket.overran):
            self.replanning.widen_kind(ticket)
        node = ticket.run.nodes[ticket.call.node_id]
        times = node.times(produced, last_at)
        if times.ttft is not None and times.tpot is not None:
            self._lane(ticket).core.router.observe(entry.backend, times.ttft, times.tpot)

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

    def _release_held(self, dropped: list[Entry]) -> None:
        """Calls that leave unserved; those reserved with their job are released."""
        for entry in dropped:
            ticket = entry.payload
            if ticket.held:  # reserved with the job, never dispatched
                self.leases.drop_call(ticket.quota_id)
                release = Close("release", entry.call.tenant_id, ticket.quota_id)
                self._start_call_task(self._send, release)

    def _forget(self, run: JobRun, now: float) -> None:
        if self.runs.pop(run.job_id, None) is None:
            return
        self._active[run.tenant_id] -= 1
        self._chars[run.tenant_id] -= run.chars
        if not self._active[run.tenant_id]:
            del self._active[run.tenant_id], self._chars[run.tenant_id]
        for lane in self.intake.lanes_of(run):
            self._release_held(lane.core.remove_job(run.job_id, now))
        self._deadlines.discard(run.job_id)
        self._held_fenced.pop(run.job_id, None)
        self.leases.drop_job(run.job_id)
        span = self._job_spans.pop(run.job_id, None)
        if span is not None:
            end_job_span(span, run)
        self.on_job_end(run)
        if self.metrics is not None:
            self.metrics.job_ended(run)
        if run.job_id in self._finished_in_store:
            self._finished_in_store.discard(run.job_id)
        elif not run.detached:  # a detached job lives on with another replica's admission
            self._start_call_task(self._send, Close("finish_job", run.tenant_id, run.job_id))
        self._wake.set()

    async def _send(self, close: Close) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self.outbox.send(close)
            except Exception:  # never the loop's end; the store reclaims it one lease later
                log.exception("quota close %s failed", close.key)
