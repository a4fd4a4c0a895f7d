"""This replica's side of the pools' fair shares across replicas: what it publishes, and when.

Each gated pool's dispatch core says which tenants have work here and where those that could
send a call now stand (`DispatchCore.heads`). An exchange with the pool's share in Redis
(`RedisShare.exchange`, gateway/share.py) publishes them, pays what the calls that ended owe
beyond their grants, and asks for a call's grant when there is one to ask for. Heads are
published when they change (after a dispatch pass in which no grant was asked, which would have
carried them) and every third of their lifetime, so that they do not lapse; nothing once the
replica hands its jobs over (`paused`). What an exchange that cannot reach the store was to pay
is owed again, for the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import anyio

from gateway.errors import ShareUnavailable
from gateway.lanes import Lane
from gateway.metrics import GatewayMetrics
from gateway.share import Ask, Grant, Heads, RedisShare

log = logging.getLogger(__name__)


class ShareExchange:
    def __init__(
        self,
        share: RedisShare,
        clock: Callable[[], float],
        paused: Callable[[], bool],
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.share = share
        self._clock = clock
        self._paused = paused
        self._metrics = metrics
        self._changed = anyio.Event()
        self._published: dict[str, Heads] = {}  # pool -> the heads it last published

    def heads(self, lane: Lane) -> Heads:
        """What this replica publishes in the pool's share: nothing once it hands over."""
        return Heads((), {}) if self._paused() else Heads(*lane.core.heads(self._clock()))

    def pass_ended(self, lane: Lane, granting: bool) -> None:
        """A dispatch pass over the lane ended: its heads go out soon if they changed, unless
        a grant asked in the pass carries them."""
        if not lane.core.gated or granting:
            return
        exact = not lane.core.policy.by_weight  # no slack: a grown offset holds others back
        if self.heads(lane).outdated(self._published.get(lane.model), exact):
            self._changed.set()

    async def exchange(self, lane: Lane, ask: Ask | None = None) -> Grant:
        """One exchange with the pool's share: the heads published, what is owed paid."""
        heads, owed = self.heads(lane), lane.core.take_owed()
        try:
            granted = await self.share.exchange(lane.model, heads, owed, ask)
        except ShareUnavailable:
            lane.core.owe(owed)  # paid with a later exchange
            if self._metrics is not None:
                self._metrics.share_unreachable()
            raise
        self._published[lane.model] = heads
        return granted

    async def publish_forever(self, lanes: Iterable[Lane]) -> None:
        """Keep this replica's heads in the gated pools' shares: when they change, and every
        third of their lifetime."""
        gated = [lane for lane in lanes if lane.core.gated]
        while True:
            with anyio.move_on_after(self.share.ttl_s / 3):
                await self._changed.wait()
            self._changed = anyio.Event()
            for lane in gated:
                try:
                    await self.exchange(lane)
                except ShareUnavailable:
                    log.warning("cannot publish the share of %s: store unreachable", lane.model)
