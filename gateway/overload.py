"""Overload control: the SLO monitor's level, applied to the dispatcher's pools.

The dispatcher reports each call's first token (its wait from ready) and its end (its time per
output token); the monitor (`gateway/slo.py`) answers with a level, which this applies at once:
level 1 and up keep a reserve of each pool's slots free of sheddable calls
(`sheddable_reserve`, so a protected call that comes finds a slot without waiting for one to be
given up; at any level running sheddable calls give their room to waiting protected calls,
`gateway/dispatch_core.py`), level 2 and up let 3/4 of each backend's batch slots be busy while
tokens are what comes slow, level 3 makes the service refuse new jobs while no slot is left for
the job's first calls within 3/4 of the slots (`admission`), and keeps the rest free of
sheddable calls too. A task ticks the monitor every TICK_S (less often when a tick is long: at
most TICK_SHARE of the event loop's time) with each waiting call's expected wait, so a level
rises while a queue forms and falls when calls stop finishing, but not while it is still at
work (`SloMonitor.acted`): a protected job refused, or calls held back that would fill the pool
again (sheddable ones at the reserve, any at the shrunk batch) while protected calls are judged.
Each change is logged, counted and shown by `fairgate_overload_level`; a wake-up lets the
dispatch loop use the room a lower level gives back.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import anyio

from gateway.lanes import Lane
from gateway.metrics import GatewayMetrics
from gateway.pool_rooms import shrunk_slots
from gateway.slo import LEVEL_NAMES, SloConfig, SloMonitor, expected_waits
from gateway.tickets import Ticket

log = logging.getLogger(__name__)
# the share of batch slots level 2 leaves busy while tokens come slow, and the share level 3
# admits new jobs into and lets sheddable calls fill (its refusals keep the queue empty, so a
# smaller batch only makes steps, and so first tokens, faster; calls admitted before still
# run). On a step-time model with a fixed cost per step (the bench's: 10 ms + 0.8 ms a call),
# a quarter fewer calls make steps a fifth shorter for about 5 % fewer tokens a second
SHRUNK_BATCH = 3 / 4
# the share of a pool's slots level 1 keeps free of sheddable calls: the protected calls that
# come while a few steps run (a slot's turn, at the rate calls end, is about a step at a full
# batch: a reserve of 8 slots of 64 covers a burst of 8); it costs the sheddable work that
# share of the batch, a few percent of throughput on a step-time model with a fixed cost
SHEDDABLE_RESERVE = 1 / 8
REFUSE_LEVEL = 3
TICK_S = 0.1  # how often waiting calls are judged and the level reconsidered
# the most of the event loop's time ticks may take: a tick looks at every call without a token,
# and one tenant may queue tens of thousands (milliseconds a thousand), so past that share ticks
# come less often rather than take the loop from every tenant's calls
TICK_SHARE = 0.1


class ShedJob(Exception):
    """A new job refused at the refusing level: no slot is left for its first calls."""


class OverloadControl:
    def __init__(
        self,
        config: SloConfig,
        lanes: Iterable[Lane],
        clock: Callable[[], float],
        on_change: Callable[[], None],
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.monitor = SloMonitor(config, clock())
        self._lanes = list(lanes)
        self._clock = clock
        self._on_change = on_change
        self._metrics = metrics
        self._applied = 0  # the level the pools run at
        self._changed = anyio.Event()
        # protected calls of jobs being admitted, by pool: slots they will want, not yet ready
        self._admitting: Counter[str] = Counter()

    @property
    def level(self) -> int:
        """The level the pools run at."""
        return self._applied

    @contextmanager
    def admission(
        self, needs: Counter[str], sheddable: bool, *, tenant: str, weight: float
    ) -> Iterator[None]:
        """Admit a job whose first calls want `needs` slots (by pool), or refuse it: at the
        refusing level, while some pool it needs has no slot for them, a job is refused
        (`ShedJob`); otherwise its protected calls hold their slots in the count until the
        block ends (the job submitted, its calls ready; or its admission failed), so that
        jobs admitted at the same moment do not all count the same free slot.

        A slot is free, or held by a sheddable call (it yields), beyond those the protected
        calls already waiting (or being admitted) will take: admitting only then keeps their
        queue empty, since a call that waits for a slot waits a call's length, while the
        backends stay busy (one is admitted as soon as a slot comes free). The waiting calls
        counted are those the fair order serves before the job's (`_ahead_of`): another
        tenant's backlog past the tenant's own load (by weight) waits behind it, and refusing
        the job for it would shed one tenant for another's flood. A refusal also
        keeps the level up (`SloMonitor.acted`): the protected load it turns away would queue
        again. Not a sheddable job's (that load gives way anyway), nor one that wants more first
        calls than the shrunk batch holds on an idle pool: it is refused whatever the load, and
        one client retrying it would hold every tenant at the refusing level."""
        if self.level >= REFUSE_LEVEL:
            short = [
                (lane, n)
                for lane in self._lanes
                if (n := needs[lane.model])
                and self._spare(lane, True, SHRUNK_BATCH, (tenant, weight, n)) < n
            ]
            if short:
                if not sheddable and all(n <= _shrunk_slots(lane) for lane, n in short):
                    self.monitor.acted(self._clock(), REFUSE_LEVEL)
                raise ShedJob
        held = Counter() if sheddable else needs
        self._admitting.update(held)
        try:
            yield
        finally:
            self._admitting.subtract(held)

    def _spare(
        self,
        lane: Lane,
        yielding: bool,
        fraction: float = 1.0,
        job: tuple[str, float, int] | None = None,
    ) -> int:
        """Free slots of the pool's serving backends, within `fraction` of their slots and the
        batch target (and, `yielding`, those of sheddable calls that would give theirs up),
        left once the protected calls waiting for room (with a `job`, a tenant's, its weight
        and its calls: those served before them), and those being admitted, take theirs."""
        core, now = lane.core, self._clock()
        rooms = core.rooms(lane.capacities(), fraction).values()
        free = sum(room.free_slots for room in rooms if room.healthy)
        if yielding:
            free += sum(entry.sheddable and not entry.yielding for entry in core.running.values())
        # by tenant, not by call: every admission asks, and one tenant may hold tens of
        # thousands of ready calls; a tenant its own quota holds back takes no slot meanwhile
        waiting = {t: core.ready.protected(t) for t in core.book.unheld_tenants(now)}
        ahead = sum(waiting.values()) if job is None else _ahead_of(lane, waiting, *job)
        return free - ahead - self._admitting[lane.model]

    def _holding_back(self, lane: Lane) -> int:
        """The level whose work keeps calls out of the pool that a lower one would let in,
        and they would fill it (0: none): 2 while calls wait for the slots the shrunk batch
        leaves out, 1 while sheddable calls wait with no more slots spare than the reserve
        (level 3's larger one included: it is full of them whenever any wait, so it would hold
        itself). A pool that is merely busy, with nothing waiting, holds nothing back: the level
        may fall (it kept itself up for good)."""
        core, capacities = lane.core, lane.capacities()
        if core.batch_fraction < 1.0 and core.ready:
            rooms = core.rooms(capacities).values()
            if sum(room.free_slots for room in rooms if room.healthy) <= 0:
                return 2
        if core.ready.sheddable and self._spare(lane, yielding=False) <= core.reserve_slots(
            capacities
        ):
            return 1
        return 0

    def first_token(self, ticket: Ticket, ttft_s: float) -> None:
        tenant, sheddable = ticket.call.tenant_id, ticket.run.spec.sheddable
        now = self._clock()
        self._apply(self.monitor.first_token(ticket.call.call_id, tenant, sheddable, ttft_s, now))

    def ended(self, ticket: Ticket, tpot_s: float | None) -> None:
        tenant, sheddable = ticket.call.tenant_id, ticket.run.spec.sheddable
        now, call_id, pool = self._clock(), ticket.call.call_id, ticket.model_name
        self._apply(self.monitor.ended(call_id, tenant, sheddable, tpot_s, now, pool))

    async def until(self, done: Callable[[int], bool]) -> None:
        """Return once the level satisfies `done` (now or after a change)."""
        while not done(self._applied):
            await self._changed.wait()

    async def run(self) -> None:
        """Tick the monitor every TICK_S, or less often when ticks are long (`tick_interval`)."""
        spent = 0.0
        while True:
            await anyio.sleep(tick_interval(spent))
            started = time.perf_counter()
            self.tick()
            spent = time.perf_counter() - started

    def tick(self) -> None:
        """Calls expected to wait past their target count as misses, and a level falls when
        calls stop coming back. A call its tenant's own quota holds back is not waiting for
        the gateway: it is not judged, nor counted as taking a slot, until released."""
        now = self._clock()
        still: set[str] = set()
        for lane in self._lanes:
            waiting = list(self._waiting(lane))
            still.update(ticket.call.call_id for ticket, _, _ in waiting)
            for ticket, wait in self._expected_waits(waiting, now, lane.model):
                call, sheddable = ticket.call, ticket.run.spec.sheddable
                self.monitor.overdue(call.call_id, call.tenant_id, sheddable, wait, now)
        self.monitor.still_waiting(still)
        # holding work back acts only for protected calls being judged: with too few of them
        # to tell, a sheddable backlog alone would hold its level (and its reserve) for good
        if self.level >= 1 and self.monitor.violation_rate(now) is not None:
            for held in {self._holding_back(lane) for lane in self._lanes} - {0}:
                self.monitor.acted(now, held)
        self._apply(self.monitor.update(now))

    def _expected_waits(
        self, waiting: list[tuple[Ticket, float, bool]], now: float, pool: str
    ) -> Iterator[tuple[Ticket, float]]:
        """Each call of `pool` without a token yet, with the wait it can expect in all: a call
        sent to its backend what it has waited; a protected call waiting for room that, plus a
        slot's turn (at the rate the pool's calls end) for itself and each protected call of
        the pool that became ready before it."""
        queue = []
        for ticket, since, queued in waiting:
            if since > now:
                continue  # its tenant's own quota holds it back
            if queued:
                queue.append((since, ticket))
            else:
                yield ticket, now - since
        queue.sort(key=lambda item: item[0])
        ready_ats = [since for since, _ in queue]
        waits = expected_waits(ready_ats, now, self.monitor.ends_per_s(now, pool))
        yield from zip((ticket for _, ticket in queue), waits, strict=True)

    def _waiting(self, lane: Lane) -> Iterator[tuple[Ticket, float, bool]]:
        """The pool's calls without a token yet (ready, being taken, or sent and not
        streaming), each with when it began to wait for the gateway (`CallBook.waiting_since`)
        and whether it is queued for a slot: ready, protected, and never held back by its
        tenant's own quota while it waited (how many of its tenant's calls the quota lets run
        once released is the quota's to say, a concurrency limit one at a time: such a call is
        judged by what it waits after, never by a place in the queue)."""
        core = lane.core
        for entries in (core.ready, core.taking, core.running):
            for entry in entries.values():
                node = entry.payload.run.nodes[entry.call.node_id]
                if node.first_token_at is None and node.ready_at is not None:
                    since = core.book.waiting_since(entry, node.ready_at)
                    queued = entries is core.ready and not entry.sheddable
                    yield entry.payload, since, queued and since == node.ready_at

    def _apply(self, level: int) -> None:
        """Apply the monitor's level. Whether the batch is shrunk is decided every time, not
        only on a change: the level may hold (at the top, for good) while what misses turns
        from first tokens to per-token times, or back."""
        shrink = level >= 2 and self.monitor.tokens_slow(self._clock())
        batch = SHRUNK_BATCH if shrink else 1.0
        resized = any(lane.core.batch_fraction != batch for lane in self._lanes)
        for lane in self._lanes:
            lane.core.batch_fraction = batch
        if level == self._applied:
            if resized:
                self._on_change()  # a batch grown back is room for the dispatch loop
            return
        reserve = 0.0 if level == 0 else SHEDDABLE_RESERVE
        if level >= REFUSE_LEVEL:
            reserve = max(reserve, 1 - SHRUNK_BATCH)
        for lane in self._lanes:
            lane.core.sheddable_reserve = reserve
        self._applied = level
        log.warning("overload level %d: %s", level, LEVEL_NAMES[level])
        if self._metrics is not None:
            self._metrics.overload(level)
        self._on_change()
        self._changed.set()
        self._changed = anyio.Event()


def tick_interval(spent_s: float) -> float:
    """The wait before the next tick after one that took `spent_s`: TICK_S, or longer so that
    ticks take at most TICK_SHARE of the time."""
    return max(TICK_S, spent_s * (1 - TICK_SHARE) / TICK_SHARE)


def _ahead_of(lane: Lane, waiting: dict[str, int], tenant: str, weight: float, n: int) -> int:
    """Of the protected calls `waiting` for room (by tenant), those the fair order serves
    before a new job's `n` calls of `tenant` (of `weight`): its own, and another tenant's
    while it holds fewer calls, running and waiting, for its weight than the tenant will (the
    order shares a pool by weight: the calls of a tenant that holds more wait behind those of
    one that holds less, as the light tenants of `share_slots` go first). By tenant: the
    calls running are few (a pool's slots), the ready ones may be tens of thousands."""
    core = lane.core
    running = Counter(
        entry.call.tenant_id
        for calls in (core.running, core.taking)
        for entry in calls.values()
        if not entry.sheddable and not entry.yielding
    )
    load = (running[tenant] + waiting.get(tenant, 0) + n) / weight
    ahead = waiting.get(tenant, 0)
    for other, count in waiting.items():
        if other != tenant and count:
            before = math.ceil(load * core.book.weight(other)) - running[other]
            ahead += min(count, max(before, 0))
    return ahead


def _shrunk_slots(lane: Lane) -> int:
    """The slots of the pool's serving backends within the shrunk batch, each backend's
    counted as the refusal's room counts it."""
    rooms = lane.capacities().values()
    return sum(shrunk_slots(room, SHRUNK_BATCH) for room in rooms if room.healthy)
