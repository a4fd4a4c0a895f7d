"""Overload control: the SLO monitor's level, applied to the dispatcher's pools.

The dispatcher reports each call's first token (its wait from ready) and its end (its time per
output token); the monitor (`gateway/slo.py`) answers with a level, which this applies at once:
level 1 and up hold sheddable jobs in every pool (`hold_sheddable`; at any level their running
calls give their room to waiting protected calls, `gateway/dispatch_core.py`), level 2 and up
let 3/4 of each backend's batch slots be busy while tokens are what comes slow, level 3 makes
the service refuse new jobs while no slot is left for one more protected call (`refusing`). A
task ticks the monitor every TICK_S with each waiting call's expected wait, so a level rises
while a queue forms and falls when calls stop finishing. Each
change is logged, counted and shown by `fairgate_overload_level`; a wake-up lets the dispatch
loop use the room a lower level gives back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

import anyio

from gateway.lanes import Lane
from gateway.metrics import GatewayMetrics
from gateway.slo import LEVEL_NAMES, SloConfig, SloMonitor, expected_waits
from gateway.tickets import Ticket

log = logging.getLogger(__name__)
SHRUNK_BATCH = 0.75  # the share of batch slots level 2 leaves busy
REFUSE_LEVEL = 3
TICK_S = 0.1  # how often waiting calls are judged and the level reconsidered


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

    @property
    def level(self) -> int:
        """The level the pools run at."""
        return self._applied

    @property
    def refusing(self) -> bool:
        """New jobs are refused: the protected classes miss their targets even so, and no
        backend has a slot for one more protected call. A slot is free, or held by a
        sheddable call (it yields), beyond those the protected calls already waiting will
        take: admitting only then keeps their queue empty, since a call that waits for a
        slot waits a call's length, while the backends stay busy (one is admitted as soon
        as a slot comes free)."""
        return self.level >= REFUSE_LEVEL and not any(map(_has_a_slot, self._lanes))

    def first_token(self, ticket: Ticket, ttft_s: float) -> None:
        tenant, sheddable = ticket.call.tenant_id, _sheddable(ticket)
        now = self._clock()
        self._apply(self.monitor.first_token(ticket.call.call_id, tenant, sheddable, ttft_s, now))

    def ended(self, ticket: Ticket, tpot_s: float | None) -> None:
        tenant, sheddable = ticket.call.tenant_id, _sheddable(ticket)
        now = self._clock()
        self._apply(self.monitor.ended(ticket.call.call_id, tenant, sheddable, tpot_s, now))

    async def until(self, done: Callable[[int], bool]) -> None:
        """Return once the level satisfies `done` (now or after a change)."""
        while not done(self._applied):
            await self._changed.wait()

    async def run(self) -> None:
        """Tick the monitor every TICK_S."""
        while True:
            await anyio.sleep(TICK_S)
            self.tick()

    def tick(self) -> None:
        """Calls expected to wait past their target count as misses, and a level falls when
        calls stop coming back."""
        now = self._clock()
        for ticket, wait in self._expected_waits(now):
            call = ticket.call
            self.monitor.overdue(call.call_id, call.tenant_id, _sheddable(ticket), wait, now)
        self._apply(self.monitor.update(now))

    def _expected_waits(self, now: float) -> Iterator[tuple[Ticket, float]]:
        """Each call without a token yet, with the wait it can expect in all: a call sent to
        its backend what it has waited; a protected call waiting for room that, plus a slot's
        turn (at the rate calls end) for itself and each protected call that became ready
        before it."""
        queue = []
        for ticket, for_room in self._waiting():
            ready_at = ticket.run.nodes[ticket.call.node_id].ready_at
            if ready_at is None:
                continue
            if for_room and not _sheddable(ticket):
                queue.append((ready_at, ticket))
            else:
                yield ticket, now - ready_at
        queue.sort(key=lambda item: item[0])
        ready_ats = [ready_at for ready_at, _ in queue]
        waits = expected_waits(ready_ats, now, self.monitor.ends_per_s(now))
        yield from zip((ticket for _, ticket in queue), waits, strict=True)

    def _waiting(self) -> Iterator[tuple[Ticket, bool]]:
        """The calls without a token yet (ready, being taken, or sent and not streaming), each
        with whether it still waits for room (ready)."""
        for lane in self._lanes:
            core = lane.core
            for entries in (core.ready, core.taking, core.running):
                for entry in entries.values():
                    node = entry.payload.run.nodes[entry.call.node_id]
                    if node.first_token_at is None:
                        yield entry.payload, entries is core.ready

    def _apply(self, level: int) -> None:
        if level == self._applied:
            return
        shrink = level >= 2 and self.monitor.tokens_slow(self._clock())
        for lane in self._lanes:
            lane.core.hold_sheddable = level >= 1
            lane.core.batch_fraction = SHRUNK_BATCH if shrink else 1.0
        self._applied = level
        log.warning("overload level %d: %s", level, LEVEL_NAMES[level])
        if self._metrics is not None:
            self._metrics.overload(level)
        self._on_change()
        self._changed.set()
        self._changed = anyio.Event()


def _has_a_slot(lane: Lane) -> bool:
    core = lane.core
    free = sum(room.free_slots for room in lane.capacities().values() if room.healthy)
    free += sum(entry.sheddable and not entry.yielding for entry in core.running.values())
    waiting = (*core.ready.values(), *core.taking.values())
    return free > sum(not entry.sheddable for entry in waiting)


def _sheddable(ticket: Ticket) -> bool:
    return ticket.run.spec.priority < 0
