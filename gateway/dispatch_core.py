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

A call of a sheddable job (negative priority) gives way to the calls of other jobs. Once a
protected call has waited for room, sheddable calls are hidden from the policy until no
protected call is left to show, and while no more slots are free than `sheddable_reserve` keeps
for protected calls to come (the SLO monitor's first level); and the newest sheddable call
running on a serving backend is chosen to yield its room (`to_yield`), one for each protected
call waiting, all at once, and only one while that call waits (a backend may show the room an
abort frees only a while later): the caller aborts it and hands it back (`yielded`), and it
waits among the ready calls to run again from its prompt. The newest loses the least work; the
waiting call's wait is what the SLO targets judge. With `share_slots`, a fair share of the
backends is kept as well as a fair order: when the waiting call's tenant runs fewer calls than
its weighted share of the serving slots (shared among the tenants with calls running or ready)
and another tenant runs more than its share even after giving one up, that tenant's newest call
(a sheddable one, for a sheddable waiting call) yields, and is held back until the waiting call
has been dispatched (or has gone), so the room goes to the call it was given up for; so is the
hold its tenant's own quota put on its tenant's other calls (the slot the yield frees would lift
it, and they would take the room back first). Without
it a tenant whose calls took every slot while others had none keeps them for as long as its
calls run: the order decides who waits, not who holds the engine. With `share_slots` and a knee,
the batch is held near the knee while it binds (`knee_cap`: some backlogged tenant is light,
with fewer calls than its weighted share of the knee's, while another runs more): past the knee
a call adds little throughput but slows every running call's step, so the light tenant's calls
run at the knee's pace, not the full batch's. Only light tenants' calls are sent past the knee;
when one finds no slot at all, the over-share tenants' newest calls past the knee yield at once
(the fewest tokens lost), so later light calls find the slots past the knee free and need no
abort; once the knee no longer binds, the batch fills again. A protected call neither yields to
a sheddable light call nor is held below the knee for light tenants with only sheddable calls.
The shares' arithmetic is `gateway.slot_share`'s.

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
call now (not held by a quota or with its job). When an attempt that was granted ends, however
it ends, what it used beyond its grant (all of it back for an attempt that never ran) is `owed`
to the share, for the caller to pay with its next exchange.

A job the caller holds (`hold_job`: its replica's lease on it may have lapsed) shows no ready
call, now or later, and is not published as waiting, until `unhold_job`.

Invariant: a call is in exactly one of ready, taking and running, and only while its job is
active, except running calls, which stay until they end (their job may have left the policy).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from gateway.backends.base import BackendCapacity
from gateway.ready_calls import ReadyCalls
from gateway.routing import Router
from gateway.slot_share import KneeBinding, furthest_over, weighted_shares
from tenants.policies import EngineLoad, JobInfo, Policy, ReadyCall, kv_token_time

T = TypeVar("T")
MAX_ATTEMPTS = 2  # a lost call runs again once
# the batch past which the policy lets only its most urgent jobs add calls: a number per
# backend, "auto" for each backend's own measure of it (`BackendCapacity.knee_calls`), or none
Knee = int | Literal["auto"] | None
# a ready call planned again: its new call and output reserve, or None where nothing changed
Replanner = Callable[["CoreCall[T]"], tuple[ReadyCall, int] | None]


@dataclass(slots=True)
class CoreCall(Generic[T]):
    """A call the core holds, with what its caller keeps beside it (`payload`)."""

    call: ReadyCall
    reserve_output: int  # KV set aside for its output on the backend
    payload: T
    reserved: bool = False  # its quota needs no reserve step (done with its job, or none)
    backend: str = ""  # where it runs or is being sent
    priority: float = 0.0  # what its backend was last told
    attempts: int = 0  # dispatches so far
    lost_on: str = ""  # the backend its last attempt was lost with: the next runs elsewhere
    sheddable: bool = False  # its job gives way to others (negative priority)
    yields: int = 0  # attempts it gave up for a waiting call (not counted as lost)
    yielding: bool = False  # chosen to yield: being aborted
    yields_to: str = ""  # the call it yields its share to: it waits until that one is sent
    granted: float = 0.0  # its attempt's charge in the pool's share (per unit of weight)
    key: float = 0.0  # where its grant put it in the pool's order: its priority once sent
    produced: int = 0  # output tokens its attempt has streamed so far

    @property
    def kv_tokens(self) -> int:
        return self.call.prompt_tokens + self.reserve_output


@dataclass(frozen=True, slots=True)
class Dispatch(Generic[T]):
    """Send this call to `entry.backend`; first ask the pool's share for it when `needs_grant`
    and reserve its quota when `needs_reserve` (either: it is taken, `launched` next)."""

    entry: CoreCall[T]
    needs_reserve: bool
    needs_grant: bool = False

    @property
    def taken(self) -> bool:
        return self.needs_reserve or self.needs_grant


@dataclass(frozen=True, slots=True)
class Reprioritize(Generic[T]):
    """Tell the backend holding this call its new priority."""

    entry: CoreCall[T]
    priority: float


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
        self.ready: ReadyCalls[CoreCall[T]] = ReadyCalls()
        self.taking: dict[str, CoreCall[T]] = {}
        self.running: dict[str, CoreCall[T]] = {}
        self._jobs: dict[str, dict[str, CoreCall[T]]] = {}  # active job -> its running calls
        self.waiting: CoreCall[T] | None = None  # the ready call the last `next` left for room
        self._yielding: set[str] = set()
        # waiting calls a running call has yielded to: one each, as a backend may show the
        # room an abort frees only a while after the aborted call's stream has ended
        self._yielded_to: set[str] = set()
        self._starved = False  # a protected call waited for room: sheddable calls are hidden
        # the share of the pool's slots kept free of sheddable calls for protected ones that
        # may come (set under overload): a sheddable call runs only while more are free
        self.sheddable_reserve = 0.0
        self.share_slots = share_slots  # over-share tenants yield to under-share ones
        # tenant -> its weight, as its last job said, and its jobs here (its entries go with
        # its last job: a tenant churn does not grow them)
        self._weights: dict[str, float] = {}
        self._tenant_jobs: Counter[str] = Counter()
        self._tenant_of_job: dict[str, str] = {}
        # a call that yielded its share -> the call it was for, and its tenant (whose quota hold
        # is lifted only once that call is sent)
        self._held_for: dict[str, tuple[str, str]] = {}
        # the share of each backend's batch slots that may be busy: below 1 under overload, so
        # the calls admitted run faster (the SLO monitor sets it)
        self.batch_fraction = 1.0
        # every call is granted by the pool's share across replicas before it is sent
        # (gateway/share.py); `owed` is what ended calls used beyond their grants, per tenant,
        # until the caller pays it there
        self.gated = gated
        self.owed: dict[str, float] = {}
        # tenant -> until when its own quota holds its calls back (once released, when it
        # did): that wait is the tenant's, not the gateway's (`waiting_since`); kept while it
        # has jobs here, or the hold lasts
        self._quota_held: dict[str, float] = {}
        # jobs whose ready calls wait unshown, and unpublished, until the caller lets them go
        # (their replica's lease on them may have lapsed)
        self._held_jobs: set[str] = set()

    # --- jobs and ready calls -------------------------------------------------------------

    def add_job(self, info: JobInfo, now: float) -> None:
        self.policy.add_job(info, now)  # validates: nothing is kept if it refuses
        self._jobs[info.job_id] = {}
        self._tenant_of_job[info.job_id] = info.tenant_id
        self._weights[info.tenant_id] = info.weight
        self._tenant_jobs[info.tenant_id] += 1

    def has_job(self, job_id: str) -> bool:
        return job_id in self._jobs

    def hold_job(self, job_id: str) -> None:
        """The job's ready calls, and those to come, wait until `unhold_job`."""
        if job_id in self._jobs:
            self.policy.hold_job(job_id)
            self._held_jobs.add(job_id)

    def unhold_job(self, job_id: str) -> None:
        self.policy.unhold_job(job_id)
        self._held_jobs.discard(job_id)

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
        if self._jobs.pop(job_id, None) is None:
            return []
        self.policy.remove_job(job_id, now)
        self._held_jobs.discard(job_id)
        self.router.forget(job_id)
        tenant = self._tenant_of_job.pop(job_id)
        self._tenant_jobs[tenant] -= 1
        if not self._tenant_jobs[tenant]:
            del self._tenant_jobs[tenant], self._weights[tenant]
            if self._quota_held.get(tenant, -math.inf) <= now:
                self._quota_held.pop(tenant, None)
        return self._forget_waiting(job_id)

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
        serving = [c for c in capacities.values() if c.healthy]
        knee: int | None = None
        if self.knee_calls == "auto":
            knees = [c.knee_calls for c in serving]
            if serving and all(k is not None for k in knees):
                knee = sum(k for k in knees if k is not None)
        elif self.knee_calls is not None:
            knee = self.knee_calls * max(len(serving), 1)
        # a pool shared with other replicas runs their calls too: the policy's jobs hold these
        own = len(self.running) + len(self.taking) if self.gated else None
        return EngineLoad(busy, 0, knee, own)

    @property
    def blocked(self) -> bool:
        """The last `next` left a ready call for want of room."""
        return self.waiting is not None

    def next(self, now: float, capacities: Mapping[str, BackendCapacity]) -> Dispatch[T] | None:
        self.waiting = None
        self._release_held_for(now)
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
        del self.ready[entry.call.call_id]
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
        return math.ceil(self.sheddable_reserve * _serving_slots(capacities))

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
        """The running calls that give their room to calls the last `next` left waiting.

        While the waiting call is protected: one sheddable call (the newest on a serving
        backend, not yielding already) for it and for each protected call the policy would
        show after it, in its order, that has none yet: a burst of protected calls gets its
        room from one abort each at once, not one per step. A call keeps the yield it was given
        until it is dispatched (a backend may show the room an abort frees only a while later).
        Else, with `share_slots`, the newest call of a tenant over its share, one at a time.
        Before any of these, while the knee binds, the calls past it (`_knee_victims`)."""
        victims = self._knee_victims(capacities, now)
        waiting = self.waiting
        if waiting is None:
            return victims
        if waiting.sheddable:
            victim = self._over_share_victim(waiting, capacities, now)
            return victims if victim is None else [*victims, victim]
        held: list[str] = []
        load = self.load(capacities)
        entry: CoreCall[T] | None = waiting
        try:
            while entry is not None and not entry.sheddable:
                call_id = entry.call.call_id
                if call_id not in self._yielded_to:
                    victim = self._newest(capacities, lambda e: e.sheddable and not e.yielding)
                    if victim is None:
                        break
                    self._mark_yielding(victim, call_id)
                    victims.append(victim)
                self.policy.hold(call_id)
                held.append(call_id)
                shown = self.policy.peek(now, load)
                entry = None if shown is None else self.ready[shown.call_id]
        finally:
            for call_id in held:
                self.policy.unhold(call_id)
        if not victims and not self._yielding:
            victim = self._over_share_victim(waiting, capacities, now)
            victims = [] if victim is None else [victim]
        return victims

    def _over_share_victim(
        self, waiting: CoreCall[T], capacities: Mapping[str, BackendCapacity], now: float
    ) -> CoreCall[T] | None:
        """With `share_slots`: the newest call of the tenant furthest over its share of the
        slots, to yield to `waiting` and wait until it is sent; one at a time. A protected call
        never yields to a sheddable one (which would give its room back to it at once), nor does
        a call past the knee yield to one the knee holds below it (it could not take the room)."""
        call_id, tenant = waiting.call.call_id, waiting.call.tenant_id
        if not self.share_slots or self._yielding or call_id in self._yielded_to:
            return None
        # while the knee holds `waiting` below it, a slot freed past the knee is none it may take
        binding = self._knee_binding(capacities, now)
        if (
            binding is not None
            and sum(binding.running.values()) > binding.knee
            and binding.caps(tenant, waiting.sheddable)
        ):
            return None
        over = self._over_share(tenant, capacities, binding)
        if over is None:
            return None
        victim = self._newest_of(over, capacities, waiting.sheddable)  # none is yielding here
        if victim is not None:
            victim.yields_to = call_id
            self._mark_yielding(victim, call_id)
        return victim

    def _knee_victims(
        self, capacities: Mapping[str, BackendCapacity], now: float
    ) -> list[CoreCall[T]]:
        """While the knee binds and a light tenant's call waits for a slot (none is free): the
        newest calls of the tenants furthest over their shares of the knee, enough to bring the
        batch back to the knee with room for the waiting call, all at once (they then wait
        until it is sent, as `_over_share_victim`'s does); none that would take a tenant below
        its share, and no protected call for a sheddable one. Once the batch is back, the light
        calls after it take the free slots past the knee, with no abort to wait for."""
        waiting, binding = self.waiting, self._knee_binding(capacities, now)
        if binding is None or waiting is None or waiting.call.call_id in self._yielded_to:
            return []
        if not binding.light(waiting.call.tenant_id):
            return []
        running = Counter(binding.running)  # less each victim, the binding left as it was
        victims: list[CoreCall[T]] = []
        for _ in range(sum(running.values()) + 1 - binding.knee):
            over = furthest_over(running, binding.share)
            if over is None:
                break
            victim = self._newest_of(over, capacities, waiting.sheddable)
            if victim is None:
                break
            victim.yields_to = waiting.call.call_id
            self._mark_yielding(victim, waiting.call.call_id)
            running[over] -= 1
            victims.append(victim)
        return victims

    def _newest_of(
        self, tenant_id: str, capacities: Mapping[str, BackendCapacity], sheddable: bool = False
    ) -> CoreCall[T] | None:
        """The tenant's newest running call on a serving backend, not yielding already (a
        sheddable one when `sheddable`)."""
        return self._newest(
            capacities,
            lambda e: (
                e.call.tenant_id == tenant_id and not e.yielding and (e.sheddable or not sheddable)
            ),
        )

    def _mark_yielding(self, victim: CoreCall[T], beneficiary: str = "") -> None:
        victim.yielding = True
        self._yielding.add(victim.call.call_id)
        if beneficiary:
            self._yielded_to.add(beneficiary)

    def _newest(
        self, capacities: Mapping[str, BackendCapacity], which: Callable[[CoreCall[T]], bool]
    ) -> CoreCall[T] | None:
        """The newest running call that `which` picks, on a backend that serves."""
        for entry in reversed(self.running.values()):
            room = capacities.get(entry.backend)
            if which(entry) and room is not None and room.healthy:
                return entry
        return None

    def _over_share(
        self,
        tenant: str,
        capacities: Mapping[str, BackendCapacity],
        binding: KneeBinding | None,
    ) -> str | None:
        """The tenant that should give a slot to `tenant`: `tenant` runs fewer calls than its
        weighted share of the serving slots (of the knee's, while it binds: `binding`), and the
        one furthest over its own share would still hold at least that share after giving one
        up; None when there is none."""
        if binding is not None:
            running, share = binding.running, binding.share
        else:
            running, share = self._tenant_shares(capacities, _serving_slots(capacities))
        if running[tenant] + 1 > share.get(tenant, 0.0):
            return None
        return furthest_over(running, share)

    def knee_cap(
        self, capacities: Mapping[str, BackendCapacity], now: float | None = None
    ) -> int | None:
        """With `share_slots`, the pool's knee while it binds (`_knee_binding`), else None."""
        binding = self._knee_binding(capacities, now)
        return None if binding is None else binding.knee

    def _knee_binding(
        self, capacities: Mapping[str, BackendCapacity], now: float | None = None
    ) -> KneeBinding | None:
        """With `share_slots` and a knee below the serving slots, the knee binds while some
        backlogged tenant is light (its calls, running or ready, are fewer than its weighted
        share of the knee's: it gains from a faster step, not from more slots) and another
        runs more than its own share plus one. Tenants that each have their share's worth of
        calls keep the full batch: the knee would only slow them all. At `now`, a tenant whose
        own quota holds back its ready calls, with none running, is not light: it can send
        nothing, and its quota makes only itself wait."""
        if not self.share_slots:
            return None
        knee = self.load(capacities).knee_calls
        if knee is None or knee >= _serving_slots(capacities):
            return None
        running, share = self._tenant_shares(capacities, knee)
        held = frozenset(
            t for t, until in self._quota_held.items() if now is not None and until > now
        )
        binding = KneeBinding(knee, running, share, self._sendable, held - running.keys())
        light = binding.lights()
        if not light:
            return None
        if any(self.ready.protected(t) for t in light):
            return binding
        protected = {
            e.call.tenant_id
            for calls in (self.running, self.taking)
            for e in calls.values()
            if not e.sheddable and not e.yielding
        }
        return dataclasses.replace(binding, holds_protected=not protected.isdisjoint(light))

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
        binding = self._knee_binding(capacities, now)
        if binding is None or not binding.caps(tenant_id, sheddable):
            return self.rooms(capacities)
        # each backend at its own knee (a pool-wide fraction would put a larger backend's calls
        # past its knee and hold a smaller one's below it)
        knees = {name: self._backend_knee(room) for name, room in capacities.items()}
        return self.rooms(
            capacities,
            {
                name: 1.0 if k is None else k / max(_slots(capacities[name]), 1)
                for name, k in knees.items()
            },
        )

    def _backend_knee(self, room: BackendCapacity) -> int | None:
        """The backend's own knee: the number per backend, or its own measure with "auto"."""
        return room.knee_calls if self.knee_calls == "auto" else self.knee_calls

    def _tenant_shares(
        self, capacities: Mapping[str, BackendCapacity], slots: int
    ) -> tuple[Counter[str], dict[str, float]]:
        """Each tenant's calls running or being sent on a serving backend (not those yielding
        already), and each backlogged tenant's (such calls or ready ones) share of `slots` by
        weight."""
        serving = {name for name, room in capacities.items() if room.healthy}
        running = Counter(
            e.call.tenant_id
            for calls in (self.running, self.taking)
            for e in calls.values()
            if e.backend in serving and not e.yielding
        )
        backlogged = {*running, *self.ready.tenants()}
        return running, weighted_shares(backlogged, self._weights, slots)

    def rooms(
        self,
        capacities: Mapping[str, BackendCapacity],
        fraction: float | Mapping[str, float] = 1.0,
    ) -> dict[str, BackendCapacity]:
        """Each backend's room less what the calls being taken there were promised, and its
        slots cut to `batch_fraction` of them (or to `fraction`, or its own in a mapping, when
        that is less)."""
        rooms = dict(capacities)
        for name, capacity in capacities.items():
            cut = min(fraction.get(name, 1.0) if isinstance(fraction, Mapping) else fraction, 1.0)
            cut = min(cut, self.batch_fraction)
            if cut < 1.0:
                rooms[name] = _shrunk(capacity, cut)
        for entry in self.taking.values():
            room = rooms.get(entry.backend)
            if room is not None:
                rooms[entry.backend] = _less(room, room.blocks_for(entry.kv_tokens))
        return rooms

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
        return kv_token_time(call.prompt_tokens, call.max_tokens) / self._weight(call.tenant_id)

    def granted(self, call_id: str, tenant_id: str, charge: float, key: float) -> None:
        """The pool's share granted the taken call `charge` at `key` in the pool's order; a
        call that left meanwhile owes it back at once."""
        entry = self.taking.get(call_id)
        if entry is None:
            self._owe(tenant_id, -charge)
        else:
            entry.granted, entry.key = charge, key

    def heads(self, now: float) -> tuple[tuple[str, ...], dict[str, float]]:
        """The tenants with work here (ready, taken or running calls), and those among them with
        a ready call no quota holds, each with the least offset of its jobs with such a call:
        what this replica publishes in the pool's share."""
        active = {
            *self.ready.tenants(),
            *(e.call.tenant_id for calls in (self.taking, self.running) for e in calls.values()),
        }
        shown = {t: self._shown_jobs(t) for t in self.unheld_tenants(now)}
        shown = {t: jobs for t, jobs in shown.items() if jobs}
        ready_jobs = {job for jobs in shown.values() for job in jobs}
        job_offsets = self.policy.pool_offsets(ready_jobs, now)
        waiting = {t: min(job_offsets.get(job, 0.0) for job in jobs) for t, jobs in shown.items()}
        return tuple(sorted(active)), waiting

    def _sendable(self, tenant_id: str) -> int:
        """The tenant's ready calls but those of its held jobs (which send nothing until let
        go: a tenant with only those is not light)."""
        count = self.ready.count(tenant_id)
        if self._held_jobs:
            held = (j for j in self.ready.jobs(tenant_id) if j in self._held_jobs)
            count -= sum(len(self.ready.of_job(j)) for j in held)
        return count

    def _shown_jobs(self, tenant_id: str) -> Collection[str]:
        """The tenant's jobs with a ready call that are not held."""
        jobs = self.ready.jobs(tenant_id)
        return [j for j in jobs if j not in self._held_jobs] if self._held_jobs else jobs

    def quota_held(self, tenant_id: str, now: float) -> bool:
        """Whether the tenant's own quota holds its calls back now."""
        return self._quota_held.get(tenant_id, -math.inf) > now

    def unheld_tenants(self, now: float) -> list[str]:
        """The tenants with a ready call that their own quota does not hold back now: those
        that could send a call (what the pool's share is told, what a slot may be wanted by)."""
        return [t for t in self.ready.tenants() if not self.quota_held(t, now)]

    def waiting_since(self, tenant_id: str, ready_at: float) -> float:
        """When a call of the tenant's that became ready at `ready_at` began to wait for the
        gateway: once ready and no longer held back by its tenant's own quota (in the future
        while it is). The SLO targets judge that wait: a tenant past its quota makes only
        itself wait, and must not raise the overload level that sheds every tenant."""
        return max(ready_at, self._quota_held.get(tenant_id, -math.inf))

    def offset(self, entry: CoreCall[T], now: float) -> float:
        """Where the taken call's tenant stands in the pool's order here beyond its service: the
        least offset (the policy's `pool_offsets`) of the call's job and of the tenant's jobs
        with a ready call. The tenant asks at the place it is published at, so that it never
        holds the pool back at a key it does not ask at; which of its own jobs goes first is
        its own affair, as it is in the policy."""
        jobs = {entry.call.job_id, *self.ready.jobs(entry.call.tenant_id)}
        job_offsets = self.policy.pool_offsets(jobs, now)
        return min(job_offsets.get(job_id, 0.0) for job_id in jobs)

    def take_owed(self) -> dict[str, float]:
        """What is owed to the pool's share, handed to the caller to pay (`owe` it back if
        the payment fails)."""
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

    def _weight(self, tenant_id: str) -> float:
        return self._weights.get(tenant_id, 1.0)

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
            self._quota_held[entry.call.tenant_id] = until

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
        if produced > entry.call.predicted_output:  # charged the excess: re-keyed
            return self.refresh(entry.call.job_id)
        return []

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
        self._yielding.discard(call_id)
        self._settle_grant(entry, prompt_tokens, produced)
        job_id = entry.call.job_id
        self._left_slot(entry, now)
        calls = self._jobs.get(job_id)
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

    def _left_slot(self, entry: CoreCall[T], now: float) -> bool:
        """A running call left its slot (ended, yielded or lost), so its tenant's concurrency
        quota has room again: its tenant's hold is lifted, unless the call had yielded its
        share to a waiting call (True): then only once that call is sent or gone
        (`_release_held_for`), or the tenant's other calls, shown again, would take the room
        back before it."""
        call, beneficiary = entry.call, entry.yields_to
        entry.yields_to = ""
        if not beneficiary or beneficiary not in self.ready:
            self._unhold_tenant(call.tenant_id, now)
            return False
        self._held_for[call.call_id] = (beneficiary, call.tenant_id)
        return True

    def _release_held_for(self, now: float) -> None:
        """Calls that yielded their share, and their tenants' quota holds, wait only until the
        call they yielded to is gone from the ready calls (sent, or ended unserved)."""
        self._yielded_to = {call_id for call_id in self._yielded_to if call_id in self.ready}
        for call_id, (other, tenant) in list(self._held_for.items()):
            if other not in self.ready:
                del self._held_for[call_id]
                if call_id in self.ready:
                    self.policy.unhold(call_id)
                if tenant in self._tenant_jobs:  # (one with no jobs here keeps it till it lapses)
                    self._unhold_tenant(tenant, now)

    def _requeue(self, entry: CoreCall[T], now: float) -> CoreCall[T] | None:
        call_id = entry.call.call_id
        calls = self._jobs.get(entry.call.job_id)
        if calls is None:
            return None
        del self.running[call_id], calls[call_id]
        self._yielding.discard(call_id)
        self._settle_grant(entry, entry.call.prompt_tokens, entry.produced)
        self.policy.requeue(call_id, now)
        if self._left_slot(entry, now):  # its room is for the call it yielded to: it waits
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
        for call_id, entry in self._jobs.get(job_id, {}).items():
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
        self._jobs[entry.call.job_id][call_id] = entry
        self.router.sent(entry.call, entry.backend)

    def _unhold_tenant(self, tenant_id: str, now: float) -> None:
        self.policy.unhold_tenant(tenant_id)
        if self.quota_held(tenant_id, now):
            self._quota_held[tenant_id] = now

    def _end_unserved(self, call_id: str, now: float) -> None:
        """A ready call leaves the policy without running: dispatched, and done with nothing."""
        self.policy.mark_dispatched(call_id, now)
        self.policy.on_finished(call_id, 0, 0, now)

    def _forget_waiting(self, job_id: str) -> list[CoreCall[T]]:
        gone = self.ready.of_job(job_id)
        for entry in gone:
            del self.ready[entry.call.call_id]
        for call_id in [c for c, e in self.taking.items() if e.call.job_id == job_id]:
            gone.append(self.taking.pop(call_id))  # few: the calls being sent at once
        for entry in gone:
            self._settle_grant(entry, entry.call.prompt_tokens, 0)
        return gone


def _less(room: BackendCapacity, blocks: int) -> BackendCapacity:
    return dataclasses.replace(
        room, free_blocks=room.free_blocks - blocks, free_slots=room.free_slots - 1
    )


def _serving_slots(capacities: Mapping[str, BackendCapacity]) -> int:
    """The batch slots of the backends that serve: busy or free."""
    return sum(_slots(r) for r in capacities.values() if r.healthy)


def _slots(room: BackendCapacity) -> int:
    """The backend's batch slots: busy or free."""
    return room.running + room.waiting + room.free_slots


def shrunk_slots(room: BackendCapacity, fraction: float) -> int:
    """The backend's slots that may be busy within `fraction` of them (one at least)."""
    # (a fraction computed as slots over slots must not lose one to rounding)
    return max(1, math.floor(_slots(room) * fraction + 1e-9))


def _shrunk(room: BackendCapacity, fraction: float) -> BackendCapacity:
    """The room left when at most `fraction` of the backend's slots may be busy."""
    slots = min(room.free_slots, shrunk_slots(room, fraction) - room.running - room.waiting)
    return dataclasses.replace(room, free_slots=slots)
