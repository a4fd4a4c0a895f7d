"""Who holds the backends: which running calls give their room up, and where the knee binds.

The dispatch core (`gateway.dispatch_core`) leaves a ready call waiting when no backend has room
for it; these are the decisions that make room for it. A call of a sheddable job (negative
priority) gives way to the calls of other jobs: the newest sheddable call running on a serving
backend is chosen to yield its room (`to_yield`), one for each protected call waiting, all at
once, and only one while that call waits (a backend may show the room an abort frees only a
while later): the caller aborts it and hands it back, and it waits among the ready calls to run
again from its prompt. The newest loses the least work; the waiting call's wait is what the SLO
targets judge.

With `share_slots`, a fair share of the backends is kept as well as a fair order: when the
waiting call's tenant runs fewer calls than its weighted share of the serving slots (shared
among the tenants with calls running or ready) and another tenant runs more than its share even
after giving one up, that tenant's newest call (a sheddable one, for a sheddable waiting call)
yields, and is held back until the waiting call has been dispatched (or has gone), so the room
goes to the call it was given up for; so is the hold its tenant's own quota put on its tenant's
other calls (the slot the yield frees would lift it, and they would take the room back first).
Without it a tenant whose calls took every slot while others had none keeps them for as long as
its calls run: the order decides who waits, not who holds the engine.

With `share_slots` and a knee, the batch is held near the knee while it binds (`knee_binding`:
some backlogged tenant is light, with fewer calls than its weighted share of the knee's, while
another runs more): past the knee a call adds little throughput but slows every running call's
step, so the light tenant's calls run at the knee's pace, not the full batch's. Only light
tenants' calls are sent past the knee; when one finds no slot at all, the over-share tenants'
newest calls past the knee yield at once (the fewest tokens lost), so later light calls find the
slots past the knee free and need no abort; once the knee no longer binds, the batch fills
again. A protected call neither yields to a sheddable light call nor is held below the knee for
light tenants with only sheddable calls. The shares' arithmetic is `gateway.slot_share`'s.

Invariant: a running call is marked yielding at most once an attempt (until it ends or runs
again), and a waiting call that was yielded to is given no more until it is sent or gone (the
knee's victims for it are chosen all at once).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from gateway.backends.base import BackendCapacity
from gateway.call_book import CallBook
from gateway.core_call import CoreCall, Knee
from gateway.pool_rooms import pool_knee, serving_slots
from gateway.slot_share import KneeBinding, furthest_over
from tenants.policies import EngineLoad, Policy

T = TypeVar("T")


class Yields(Generic[T]):
    def __init__(
        self, book: CallBook[T], policy: Policy, knee_calls: Knee, share_slots: bool
    ) -> None:
        self._book = book
        self._policy = policy
        self._knee_calls = knee_calls
        self.share_slots = share_slots  # over-share tenants yield to under-share ones
        self._yielding: set[str] = set()
        # waiting calls a running call has yielded to: one each, as a backend may show the
        # room an abort frees only a while after the aborted call's stream has ended
        self._yielded_to: set[str] = set()
        # a call that yielded its share -> the call it was for, and its tenant (whose quota hold
        # is lifted only once that call is sent)
        self._held_for: dict[str, tuple[str, str]] = {}

    def to_yield(
        self,
        waiting: CoreCall[T] | None,
        now: float,
        capacities: Mapping[str, BackendCapacity],
        load: Callable[[], EngineLoad],
    ) -> list[CoreCall[T]]:
        """The running calls that give their room to `waiting`, the call the core's last pass
        left for want of room (`load`: the pool's, as the policy is told it, asked only when the
        policy's order behind a protected waiting call is walked).

        While the waiting call is protected: one sheddable call (the newest on a serving
        backend, not yielding already) for it and for each protected call the policy would
        show after it, in its order, that has none yet: a burst of protected calls gets its
        room from one abort each at once, not one per step. A call keeps the yield it was given
        until it is dispatched (a backend may show the room an abort frees only a while later).
        Else, with `share_slots`, the newest call of a tenant over its share, one at a time.
        Before any of these, while the knee binds, the calls past it (`_knee_victims`)."""
        victims = self._knee_victims(waiting, capacities, now)
        if waiting is None:
            return victims
        if waiting.sheddable:
            victim = self._over_share_victim(waiting, capacities, now)
            return victims if victim is None else [*victims, victim]
        held: list[str] = []
        pool_load = load()
        entry: CoreCall[T] | None = waiting
        try:
            while entry is not None and not entry.sheddable:
                call_id = entry.call.call_id
                if call_id not in self._yielded_to:
                    victim = self._book.newest(capacities, lambda e: e.sheddable and not e.yielding)
                    if victim is None:
                        break
                    self._mark_yielding(victim, call_id)
                    victims.append(victim)
                self._policy.hold(call_id)
                held.append(call_id)
                shown = self._policy.peek(now, pool_load)
                entry = None if shown is None else self._book.ready[shown.call_id]
        finally:
            for call_id in held:
                self._policy.unhold(call_id)
        if not victims and not self._yielding:
            victim = self._over_share_victim(waiting, capacities, now)
            victims = [] if victim is None else [victim]
        return victims

    def knee_binding(
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
        knee = pool_knee(self._knee_calls, capacities)
        if knee is None or knee >= serving_slots(capacities):
            return None
        book = self._book
        running, share = book.tenant_shares(capacities, knee)
        held = frozenset(
            t for t, until in book.quota_until.items() if now is not None and until > now
        )
        binding = KneeBinding(knee, running, share, book.sendable, held - running.keys())
        light = binding.lights()
        if not light:
            return None
        if any(book.ready.protected(t) for t in light):
            return binding
        holds_protected = not book.protected_tenants().isdisjoint(light)
        return dataclasses.replace(binding, holds_protected=holds_protected)

    # --- the lifecycle of a yield ---------------------------------------------------------

    def left_slot(self, entry: CoreCall[T], now: float) -> bool:
        """A running call left its slot (ended, yielded or lost), so its tenant's concurrency
        quota has room again: its tenant's hold is lifted, unless the call had yielded its
        share to a waiting call (True): then only once that call is sent or gone
        (`release_held_for`), or the tenant's other calls, shown again, would take the room
        back before it."""
        self._yielding.discard(entry.call.call_id)
        call, beneficiary = entry.call, entry.yields_to
        entry.yields_to = ""
        if not beneficiary or beneficiary not in self._book.ready:
            self._unhold_tenant(call.tenant_id, now)
            return False
        self._held_for[call.call_id] = (beneficiary, call.tenant_id)
        return True

    def release_held_for(self, now: float) -> None:
        """Calls that yielded their share, and their tenants' quota holds, wait only until the
        call they yielded to is gone from the ready calls (taken, sent, or ended unserved). That
        call is given no more yields until it is sent or gone: one taken may be sent back (its
        quota or the pool's share refused it) after its room went to others, and a yield at each
        refusal would abort another call each time."""
        ready, taking = self._book.ready, self._book.taking
        self._yielded_to = {c for c in self._yielded_to if c in ready or c in taking}
        for call_id, (other, tenant) in list(self._held_for.items()):
            if other not in ready:
                del self._held_for[call_id]
                if call_id in ready:
                    self._policy.unhold(call_id)
                if self._book.has_tenant(tenant):  # (one with no jobs keeps it till it lapses)
                    self._unhold_tenant(tenant, now)

    def _unhold_tenant(self, tenant_id: str, now: float) -> None:
        self._policy.unhold_tenant(tenant_id)
        if self._book.quota_holds(tenant_id, now):
            self._book.quota_until[tenant_id] = now

    # --- victims --------------------------------------------------------------------------

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
        binding = self.knee_binding(capacities, now)
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
        self,
        waiting: CoreCall[T] | None,
        capacities: Mapping[str, BackendCapacity],
        now: float,
    ) -> list[CoreCall[T]]:
        """While the knee binds and a light tenant's call waits for a slot (none is free): the
        newest calls of the tenants furthest over their shares of the knee, enough to bring the
        batch back to the knee with room for the waiting call, all at once (they then wait
        until it is sent, as `_over_share_victim`'s does); none that would take a tenant below
        its share, and no protected call for a sheddable one. Once the batch is back, the light
        calls after it take the free slots past the knee, with no abort to wait for."""
        binding = self.knee_binding(capacities, now)
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
        return self._book.newest(
            capacities,
            lambda e: (
                e.call.tenant_id == tenant_id and not e.yielding and (e.sheddable or not sheddable)
            ),
        )

    def _mark_yielding(self, victim: CoreCall[T], beneficiary: str) -> None:
        victim.yielding = True
        self._yielding.add(victim.call.call_id)
        self._yielded_to.add(beneficiary)

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
            running, share = self._book.tenant_shares(capacities, serving_slots(capacities))
        if running[tenant] + 1 > share.get(tenant, 0.0):
            return None
        return furthest_over(running, share)
