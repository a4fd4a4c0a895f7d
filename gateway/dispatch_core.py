"""The dispatch decisions without I/O: which ready call runs next, and on which backend.

The core owns the fair-share policy, the ready calls, the room accounting and each call's
lifecycle; it takes `now` and the backends' capacity snapshots and returns decisions, which the
async `Dispatcher` (quota store, backends, job streams) and the scheduling simulator perform.

`next(now, capacities)` asks the policy for the first call in its order (telling it how busy
the pool is) and routes it to a backend that can admit it at once: a free batch slot and KV for
its prompt plus its reserved output, less what the calls it is still taking were promised there.
When no backend has room the answer is None and the call waits (the caller asks again when a
call ends): the backends' own queues stay short, so the policy's order is the order that runs.
A call whose quota is reserved already (with its job's admission, or where there is no quota)
is dispatched at once and the caller submits it before asking again, so the next snapshot
counts it. Any other call is *taken*: held in the policy, its room promised, while the caller
reserves its quota; then it is `launched`, sent back to wait (`retry_later`, its tenant held
until a time) or `drop`ped unserved.

A call left waiting for room may have room made for it: a sheddable call gives way to the
calls of other jobs, and with `share_slots` a tenant over its share of the backends' slots (or
of the knee's, while the knee binds) to one under it (`to_yield`, `gateway.yields`). The calls
the core holds, by state and tenant, are in its `CallBook` (`gateway.call_book`), and what
room the backends' snapshots leave is worked out by `gateway.pool_rooms`.

A running call reports progress and finishes; the policy re-keys its job with what it really
costs, and the calls of that job a backend holds get their new priority (`Reprioritize`); so
do the jobs of a tenant whose ready calls are planned again (`replan`: a kind of its calls was
found to mispredict, and those planned before are ordered and reserved as planned now). A call
lost with its backend goes back to the ready calls once (`lost`), to run on another backend of
the pool (the same one only in a pool of one); lost again, it fails.

A gated core (a pool shared with other gateway replicas, gateway/share.py) takes every call,
even one reserved with its job, so that the caller first asks the pool's share for it: `charge`
is what a grant costs its tenant (worst-case KV token-time per unit of weight; nothing where the
policy does not share by weight), `granted` records it with the call's key in the pool's order
(the priority a shared server is told, so that what several replicas sent it runs in that order;
not re-keyed later: a server takes a priority once), `retry_later(quota=False)` sends back a
call the share made wait, and `heads` says which tenants have work here and which could send a
call now (not held by a quota or with its job; none while no backend of the pool serves here).
When an attempt that was granted ends, however it ends, what it used beyond its grant (all of
it back for an attempt that never ran) is `owed` to the share, for the caller to pay with its
next exchange.

A job the caller holds (`hold_job`: its replica's lease on it may have lapsed) shows no ready
call, now or later, and is not published as waiting, until `unhold_job`.

Invariant: a call is in exactly one of ready, taking and running, and only while its job is
active, except running calls, which stay until they end (their job may have left the policy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Generic, TypeVar

from gateway.backends.base import BackendCapacity
from gateway.call_book import CallBook
from gateway.core_call import CoreCall, Dispatch, Knee, Replanner, Reprioritize
from gateway.pool_rooms import knee_fractions, pool_knee, rooms_left, serving_slots
from gateway.routing import Router
from gateway.yields import Yields
from tenants.policies import EngineLoad, JobInfo, Policy, ReadyCall, kv_token_time

T = TypeVar("T")
MAX_ATTEMPTS = 2  # a lost call runs again once
# A job whose calls run past their predictions is charged each token at once, but its running
# calls' priorities follow at most this often: every token of every call re-keyed all of its
# job's calls, a job of 256 calls 256 times a step (minutes of the event loop for one job).
PROGRESS_REKEY_S = 0.05


class DispatchCore(Generic[T]):
    def __init__(
        self,
        policy: Policy,
        knee_calls: Knee = None,
        router: Router | None = None,
        share_slots: bool = False,
        gated: bool = False,
    ) -> None:
        self.policy = policy
        self.knee_calls = knee_calls
        self.router = router or Router()
        self.book: CallBook[T] = CallBook()
        # the book's calls by state, as the caller reads them
        self.ready, self.taking, self.running = self.book.ready, self.book.taking, self.book.running
        self.waiting: CoreCall[T] | None = None  # the ready call the last `next` left for room
        self.yields: Yields[T] = Yields(self.book, policy, knee_calls, share_slots)
        self._starved = False  # a protected call waited for room: sheddable calls are hidden
        # the share of the pool's slots kept free of sheddable calls for protected ones that
        # may come (set under overload): a sheddable call runs only while more are free
        self.sheddable_reserve = 0.0
        # the share of each backend's batch slots that may be busy: below 1 under overload, so
        # the calls admitted run faster (the SLO monitor sets it)
        self.batch_fraction = 1.0
        # every call is granted by the pool's share across replicas before it is sent
        # (gateway/share.py); `owed` is what ended calls used beyond their grants, per tenant,
        # until the caller pays it there
        self.gated = gated
        self.owed: dict[str, float] = {}
        self._rekey_after: dict[str, float] = {}  # job -> when progress may re-key it again

    # --- jobs and ready calls -------------------------------------------------------------

    def add_job(self, info: JobInfo, now: float) -> None:
        self.policy.add_job(info, now)  # validates: nothing is kept if it refuses
        self.book.add_job(info)

    def has_job(self, job_id: str) -> bool:
        return job_id in self.book.jobs

    def hold_job(self, job_id: str) -> None:
        """The job's ready calls, and those to come, wait until `unhold_job`."""
        if job_id in self.book.jobs:
            self.policy.hold_job(job_id)
            self.book.held_jobs.add(job_id)

    def unhold_job(self, job_id: str) -> None:
        self.policy.unhold_job(job_id)
        self.book.held_jobs.discard(job_id)

    def add_ready(
        self,
        call: ReadyCall,
        reserve_output: int,
        payload: T,
        now: float,
        reserved: bool = False,
        sheddable: bool = False,
    ) -> CoreCall[T]:
        entry = CoreCall(call, reserve_output, payload, reserved, sheddable=sheddable)
        self.policy.add_ready(call, now)
        self.ready[call.call_id] = entry
        return entry

    def remove_job(self, job_id: str, now: float) -> list[CoreCall[T]]:
        """The job leaves the policy; its ready and taking calls are forgotten and returned
        (its running calls end on their own, the caller aborts them)."""
        if not self.book.remove_job(job_id, now):
            return []
        self._rekey_after.pop(job_id, None)
        self.policy.remove_job(job_id, now)
        self.router.forget(job_id)
        gone = self.book.waiting_of(job_id)
        for entry in gone:
            self._settle_grant(entry, entry.call.prompt_tokens, 0)
        return gone

    def replan(
        self,
        tenant_id: str,
        plan: Replanner[T],
        now: float,
    ) -> list[Reprioritize[T]]:
        """The tenant's ready calls planned again (a kind of its calls was found to mispredict):
        each that `plan` answers takes its new call and output reserve, and the policy re-keys
        its job."""
        changed = []
        for job_id in list(self.ready.jobs(tenant_id)):
            changed += self.replan_job(job_id, plan, now)
        return changed

    def replan_job(
        self,
        job_id: str,
        plan: Replanner[T],
        now: float,
    ) -> list[Reprioritize[T]]:
        """One job's ready calls planned again as `replan` does: a caller that must not hold
        its loop for a whole backlog goes through the tenant's jobs one at a time."""
        if self._replan(self.ready.of_job(job_id), plan, now):
            return self.refresh(job_id)
        return []

    def replan_call(
        self,
        call_id: str,
        plan: Replanner[T],
        now: float,
    ) -> list[Reprioritize[T]]:
        """One ready call planned again as `replan` does (one just sent back to wait), without
        a look at its tenant's other ready calls."""
        entry = self.ready.get(call_id)
        if entry is None or not self._replan([entry], plan, now):
            return []
        return self.refresh(entry.call.job_id)

    def _replan(
        self,
        entries: list[CoreCall[T]],
        plan: Replanner[T],
        now: float,
    ) -> bool:
        """Whether `plan` planned any of the ready `entries` again (the policy told of each)."""
        replanned = False
        for entry in entries:
            again = plan(entry)
            if again is not None:
                entry.call, entry.reserve_output = again
                self.policy.on_refined(entry.call.call_id, entry.call.predicted_output, now)
                replanned = True
        return replanned

    def withdraw_unsent(self, job_id: str, now: float) -> list[CoreCall[T]]:
        """A cancelled job that has a call still ending: its ready calls and those being taken
        leave unserved (a taken one is not launched when its reserve or grant lands)."""
        taken = [e for e in self.taking.values() if e.call.job_id == job_id]
        dropped = [*self.ready.of_job(job_id), *taken]
        for entry in dropped:
            self.drop(entry.call.call_id, now)
        return dropped

    # --- dispatch -------------------------------------------------------------------------

    def load(self, capacities: Mapping[str, BackendCapacity]) -> EngineLoad:
        """How busy the pool is, as the policy is told: calls the backends hold or are being
        sent, against the knees of the backends that serve (with "auto", none until every one
        of them has measured its own)."""
        busy = sum(c.running + c.waiting for c in capacities.values()) + len(self.taking)
        knee = pool_knee(self.knee_calls, capacities)
        # a pool shared with other replicas runs their calls too: the policy's jobs hold these
        own = len(self.running) + len(self.taking) if self.gated else None
        return EngineLoad(busy, 0, knee, own)

    @property
    def blocked(self) -> bool:
        """The last `next` left a ready call for want of room."""
        return self.waiting is not None

    def next(self, now: float, capacities: Mapping[str, BackendCapacity]) -> Dispatch[T] | None:
        self.waiting = None
        self.yields.release_held_for(now)
        load = self.load(capacities)
        reserved = self._reserve_reached(capacities)
        self.policy.set_shedding(reserved or self._starved)
        call = self.policy.peek(now, load)
        if call is None and self._starved and not reserved:
            self._starved = False  # no protected call left to show: sheddable ones may run
            self.policy.set_shedding(False)
            call = self.policy.peek(now, load)
        if call is None:
            return None
        entry = self.ready[call.call_id]
        backend = self._route(entry, capacities, now)
        if backend is None and entry.sheddable:
            # a protected call behind it is the one to wait for room (and be yielded to)
            self.policy.set_shedding(True)
            shown = self.policy.peek(now, load)
            if shown is not None:
                entry = self.ready[shown.call_id]
                backend = self._route(entry, capacities, now)
        if backend is None:
            self.waiting = entry
            self._starved = not entry.sheddable
            return None
        entry.backend = backend
        self.book.leave_ready(entry, now)
        if entry.reserved and not self.gated:
            self._dispatched(entry, now)
            return Dispatch(entry, needs_reserve=False)
        self.policy.hold(entry.call.call_id)
        self.taking[entry.call.call_id] = entry
        return Dispatch(entry, needs_reserve=not entry.reserved, needs_grant=self.gated)

    def _route(
        self, entry: CoreCall[T], capacities: Mapping[str, BackendCapacity], now: float
    ) -> str | None:
        """A backend with room for the call now (another than the one it was lost on, where
        another serves), or None."""
        rooms = self._rooms_for(entry.call.tenant_id, entry.sheddable, capacities, now)
        if entry.lost_on and any(r.healthy for b, r in rooms.items() if b != entry.lost_on):
            rooms.pop(entry.lost_on, None)
        return self.router.route(entry.call, entry.kv_tokens, rooms)

    def reserve_slots(self, capacities: Mapping[str, BackendCapacity]) -> int:
        """How many of the serving backends' slots `sheddable_reserve` keeps from sheddable
        calls."""
        return math.ceil(self.sheddable_reserve * serving_slots(capacities))

    def _reserve_reached(self, capacities: Mapping[str, BackendCapacity]) -> bool:
        """Whether no more slots are free than the reserve (so sheddable calls wait)."""
        if self.sheddable_reserve <= 0:
            return False
        free = sum(room.free_slots for room in self.rooms(capacities).values() if room.healthy)
        return free <= self.reserve_slots(capacities)

    def starts_at_once(
        self,
        call: ReadyCall,
        reserve_output: int,
        capacities: Mapping[str, BackendCapacity],
        sheddable: bool = False,
    ) -> bool:
        """Would a new job's only call be dispatched by the next pass whatever the policy's
        order? Some backend has room for it and for every ready call, below its knee, and a
        sheddable call finds more free slots than the reserve kept from it."""
        if sheddable and self._reserve_reached(capacities):
            return False
        load = self.load(capacities)
        ready = len(self.ready)
        if load.knee_calls is not None and load.running_calls + ready >= load.knee_calls:
            return False  # busy as the pass counts it: calls being taken count as running
        # a slot for each ready call first: their needs are summed only when they are few
        rooms = [
            r
            for r in self._rooms_for(call.tenant_id, sheddable, capacities).values()
            if r.healthy and r.free_slots > ready
        ]
        if not rooms:
            return False
        needs = [call.prompt_tokens + reserve_output, *(e.kv_tokens for e in self.ready.values())]
        return any(room.free_blocks >= sum(room.blocks_for(n) for n in needs) for room in rooms)

    def to_yield(self, now: float, capacities: Mapping[str, BackendCapacity]) -> list[CoreCall[T]]:
        """The running calls that give their room to the call the last `next` left waiting
        (`Yields.to_yield`): the caller aborts each and hands it back (`yielded`)."""
        return self.yields.to_yield(self.waiting, now, capacities, lambda: self.load(capacities))

    def knee_cap(
        self, capacities: Mapping[str, BackendCapacity], now: float | None = None
    ) -> int | None:
        """With `share_slots`, the pool's knee while it binds (`Yields.knee_binding`), else
        None."""
        binding = self.yields.knee_binding(capacities, now)
        return None if binding is None else binding.knee

    def _rooms_for(
        self,
        tenant_id: str,
        sheddable: bool,
        capacities: Mapping[str, BackendCapacity],
        now: float | None = None,
    ) -> dict[str, BackendCapacity]:
        """The rooms a call of the tenant may take: while the knee binds, only those below it
        unless the tenant is light (or the call is protected and the light tenants have only
        sheddable calls)."""
        binding = self.yields.knee_binding(capacities, now)
        if binding is None or not binding.caps(tenant_id, sheddable):
            return self.rooms(capacities)
        return self.rooms(capacities, knee_fractions(self.knee_calls, capacities))

    def rooms(
        self,
        capacities: Mapping[str, BackendCapacity],
        fraction: float | Mapping[str, float] = 1.0,
    ) -> dict[str, BackendCapacity]:
        """Each backend's room less what the calls being taken there were promised, and its
        slots cut to `batch_fraction` of them (or to `fraction`, or its own in a mapping, when
        that is less)."""
        return rooms_left(capacities, self.taking.values(), fraction, self.batch_fraction)

    # --- a taken call's grant and quota ---------------------------------------------------

    def charge(self, entry: CoreCall[T]) -> float:
        """What a grant charges the call in the pool's share: its worst case, the KV token-time
        of its prompt and max_tokens, per unit of its tenant's weight (trued up when it ends).
        A prediction would do on average, but one that falls short lets a tenant take a whole
        wave of freed slots before its calls' true cost is known: the worst case cannot. Nothing
        for a policy that does not share by weight: its order is its jobs' own keys."""
        call = entry.call
        if not self.policy.by_weight:
            return 0.0
        return kv_token_time(call.prompt_tokens, call.max_tokens) / self.book.weight(call.tenant_id)

    def granted(self, call_id: str, tenant_id: str, charge: float, key: float) -> None:
        """The pool's share granted the taken call `charge` at `key` in the pool's order; a
        call that left meanwhile owes it back at once."""
        entry = self.taking.get(call_id)
        if entry is None:
            self._owe(tenant_id, -charge)
        else:
            entry.granted, entry.key = charge, key

    def heads(self, now: float, serving: bool = True) -> tuple[tuple[str, ...], dict[str, float]]:
        """The tenants with work here (ready, taken or running calls), and those among them with
        a ready call no quota holds, each with the least offset of its jobs with such a call:
        what this replica publishes in the pool's share. None waits unless some backend of the
        pool is `serving` in this replica's view (not so: its breaker open, its metrics stale, a
        partition from this replica alone): this replica could send nothing, and a tenant
        published waiting here would hold back every other replica's, which may reach the
        servers."""
        active = self.book.active_tenants()
        if not serving:
            return tuple(sorted(active)), {}
        shown = {t: self.book.shown_jobs(t) for t in self.book.unheld_tenants(now)}
        shown = {t: jobs for t, jobs in shown.items() if jobs}
        ready_jobs = {job for jobs in shown.values() for job in jobs}
        job_offsets = self.policy.pool_offsets(ready_jobs, now)
        waiting = {t: min(job_offsets.get(job, 0.0) for job in jobs) for t, jobs in shown.items()}
        return tuple(sorted(active)), waiting

    def offset(self, entry: CoreCall[T], now: float) -> float:
        """Where the taken call's tenant stands in the pool's order here beyond its service: the
        least offset (the policy's `pool_offsets`) of the call's job and of the tenant's jobs
        with a ready call that are not held. The tenant asks at the place it is published at
        (`heads`), so that it never holds the pool back at a key it does not ask at, nor asks
        ahead of it for a held job that cannot send; which of its own jobs goes first is its
        own affair, as it is in the policy."""
        jobs = {entry.call.job_id, *self.book.shown_jobs(entry.call.tenant_id)}
        job_offsets = self.policy.pool_offsets(jobs, now)
        return min(job_offsets.get(job_id, 0.0) for job_id in jobs)

    def take_owed(self) -> dict[str, float]:
        """What is owed to the pool's share, handed to the caller to pay (and to send again if
        the payment goes unanswered)."""
        owed, self.owed = self.owed, {}
        return owed

    def owe(self, owed: Mapping[str, float]) -> None:
        for tenant, amount in owed.items():
            self._owe(tenant, amount)

    def _owe(self, tenant_id: str, amount: float) -> None:
        if amount:
            self.owed[tenant_id] = self.owed.get(tenant_id, 0.0) + amount

    def _settle_grant(self, entry: CoreCall[T], prompt_tokens: int, produced: int) -> None:
        """The attempt ended having used `produced` output tokens: its grant is trued up, at
        the weight it was granted at (its tenant's jobs may have all left since)."""
        if entry.granted:
            call = entry.call
            worst = kv_token_time(call.prompt_tokens, call.max_tokens)
            used = entry.granted * kv_token_time(prompt_tokens, produced) / worst
            self._owe(call.tenant_id, used - entry.granted)
            entry.granted = 0.0
        entry.produced = 0

    def launched(self, call_id: str, now: float) -> CoreCall[T] | None:
        """Its quota is reserved: it runs. None when its job ended meanwhile (release it)."""
        entry = self.taking.pop(call_id, None)
        if entry is None:
            return None
        self._dispatched(entry, now)
        return entry

    def retry_later(self, call_id: str, until: float, *, quota: bool = True) -> None:
        """A quota (or, not `quota`, the pool's share) refused the call until `until`: it
        waits, and its tenant's calls with it."""
        entry = self.taking.pop(call_id, None)
        if entry is None:
            return
        self._settle_grant(entry, entry.call.prompt_tokens, 0)
        self.policy.unhold(call_id)
        self.ready[call_id] = entry
        self.policy.hold_tenant(entry.call.tenant_id, until)
        if quota:
            self.book.quota_until[entry.call.tenant_id] = until

    def drop(self, call_id: str, now: float) -> CoreCall[T] | None:
        """A ready or taken call that will never run leaves the policy unserved."""
        entry = self.taking.pop(call_id, None) or self.ready.pop(call_id, None)
        if entry is not None:
            self._settle_grant(entry, entry.call.prompt_tokens, 0)
            self._end_unserved(call_id, now)
        return entry

    # --- a running call -------------------------------------------------------------------

    def priority(self, call_id: str) -> float:
        return self.policy.priority(call_id)

    def progress(self, call_id: str, produced: int, now: float) -> list[Reprioritize[T]]:
        entry = self.running[call_id]
        entry.produced = produced
        if not self.has_job(entry.call.job_id):
            return []  # an ended job has left the policy
        self.policy.on_progress(call_id, produced, now)
        job_id = entry.call.job_id
        # charged the excess: re-keyed, its running calls told so now and then
        if produced <= entry.call.predicted_output or now < self._rekey_after.get(job_id, now):
            return []
        self._rekey_after[job_id] = now + PROGRESS_REKEY_S
        return self.refresh(job_id)

    def refined(
        self, call_id: str, call: ReadyCall, reserve_output: int, now: float
    ) -> list[Reprioritize[T]]:
        """The call's output predicted again once prefilled: the policy re-keys its job."""
        entry = self.running[call_id]
        entry.call, entry.reserve_output = call, reserve_output
        if not self.has_job(call.job_id):
            return []
        self.policy.on_refined(call_id, call.predicted_output, now)
        return self.refresh(call.job_id)

    def finished(
        self, call_id: str, prompt_tokens: int, produced: int, now: float
    ) -> list[Reprioritize[T]]:
        """The call ended (done, failed or aborted): the policy learns what it cost."""
        entry = self.running.pop(call_id)
        self._settle_grant(entry, prompt_tokens, produced)
        job_id = entry.call.job_id
        self.yields.left_slot(entry, now)
        calls = self.book.jobs.get(job_id)
        if calls is None:
            return []
        del calls[call_id]
        self.policy.on_finished(call_id, prompt_tokens, produced, now)
        return self.refresh(job_id)  # re-keyed with the truth

    def lost(self, call_id: str, now: float) -> CoreCall[T] | None:
        """The backend failed while it held the call: ready again for another attempt (its
        quota to be reserved again), or None when it has had its attempts or its job ended."""
        entry = self.running[call_id]
        if entry.attempts - entry.yields >= MAX_ATTEMPTS:
            return None
        lost_on = entry.backend
        if self._requeue(entry, now) is None:
            return None
        entry.lost_on = lost_on
        return entry

    def yielded(self, call_id: str, now: float) -> CoreCall[T] | None:
        """A call chosen by `to_yield` was aborted: ready again, its quota to be reserved
        again; None when its job ended meanwhile."""
        entry = self._requeue(self.running[call_id], now)
        if entry is not None:
            entry.yields += 1
        return entry

    def _requeue(self, entry: CoreCall[T], now: float) -> CoreCall[T] | None:
        call_id = entry.call.call_id
        calls = self.book.jobs.get(entry.call.job_id)
        if calls is None:
            return None
        del self.running[call_id], calls[call_id]
        self._settle_grant(entry, entry.call.prompt_tokens, entry.produced)
        self.policy.requeue(call_id, now)
        if self.yields.left_slot(entry, now):  # its room is for the call it yielded to: it waits
            self.policy.hold(call_id)
        entry.reserved, entry.backend, entry.yielding = False, "", False
        self.ready[call_id] = entry
        return entry

    def refresh(self, job_id: str) -> list[Reprioritize[T]]:
        """The job was re-keyed: its running calls whose priority changed (none in a gated
        core: a call's priority there is the key its grant gave it)."""
        if self.gated:
            return []
        changed = []
        for call_id, entry in self.book.jobs.get(job_id, {}).items():
            priority = self.policy.priority(call_id)
            if priority != entry.priority:
                entry.priority = priority
                changed.append(Reprioritize(entry, priority))
        return changed

    # --- helpers --------------------------------------------------------------------------

    def _dispatched(self, entry: CoreCall[T], now: float) -> None:
        call_id = entry.call.call_id
        self.policy.mark_dispatched(call_id, now)
        # a shared server orders what several replicas sent it by the pool's order, which no
        # replica's own policy keys
        entry.priority = entry.key if self.gated else self.policy.priority(call_id)
        entry.attempts += 1
        self.running[call_id] = entry
        self.book.jobs[entry.call.job_id][call_id] = entry
        self.router.sent(entry.call, entry.backend)

    def _end_unserved(self, call_id: str, now: float) -> None:
        """A ready call leaves the policy without running: dispatched, and done with nothing."""
        self.policy.mark_dispatched(call_id, now)
        self.policy.on_finished(call_id, 0, 0, now)
