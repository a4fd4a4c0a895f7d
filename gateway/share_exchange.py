"""This replica's side of the pools' fair shares across replicas: what it publishes, and when.

Each gated pool's dispatch core says which tenants have work here and where those that could
send a call now stand (`DispatchCore.heads`). An exchange with the pool's share in Redis
(`RedisShare.exchange`, gateway/share.py) publishes them, pays what the calls that ended owe
beyond their grants, and asks for a call's grant when there is one to ask for. Heads are
published when they change (after a dispatch pass in which no grant was asked, which would have
carried them) and every third of their lifetime, so that they do not lapse; nothing once the
replica hands its jobs over (`paused`).

An exchange whose reply never came (the store unreachable past the client's one retry, or the
exchange cancelled) may or may not have run: it is kept, and sent again under its nonce before
the pool's next exchange, by one task at a time; while it does, the pool's other exchanges fail
at once as with the store unreachable, sending nothing and keeping nothing, so that an outage
keeps no more than the exchanges sent before its first failure. Each is dropped once answered. The
script answers one that ran as it did (a grant it made, which no call took, is owed back) and
runs one that did not, without its ask: what it was to pay is paid once either way (unless the
store kept its reply no longer, `REPLY_TTL_S`: then it runs again).

At close (`close`, once the replica's calls have ended: each aborted call's grant trued up, its
worst case owed back), one last exchange per gated pool pays what is owed and takes this
replica's heads out of the pool: shielded from the shutdown's cancellation and bounded by
`FINAL_EXCHANGE_S`, so that a rolling restart leaves no tenant charged for calls it never ran.
A replica killed pays nothing more: its grants stay charged at their worst case.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import anyio

from gateway.errors import ShareUnavailable
from gateway.lanes import Lane
from gateway.metrics import GatewayMetrics
from gateway.share import Ask, Grant, Heads, RedisShare

log = logging.getLogger(__name__)
FINAL_EXCHANGE_S = 2.0  # how long the exchanges at close may take, all pools together


@dataclass(frozen=True, slots=True)
class Unsure:
    """An exchange whose reply never came: it may have run."""

    nonce: str
    owed: dict[str, float]  # what it was to pay
    ask: Ask | None  # what it asked for (a grant it made went to no call)


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
        self._unsure: dict[str, list[Unsure]] = {}  # pool -> its exchanges unanswered
        self._resending: set[str] = set()  # pools whose unanswered exchanges a task sends again

    def heads(self, lane: Lane) -> Heads:
        """What this replica publishes in the pool's share: nothing once it hands over, and no
        tenant waiting while none of the pool's backends serves in this replica's view."""
        if self._paused():
            return Heads((), {})
        serving = any(room.healthy for room in lane.capacities().values())
        return Heads(*lane.core.heads(self._clock(), serving))

    def pass_ended(self, lane: Lane, granting: bool) -> None:
        """A dispatch pass over the lane ended: its heads go out soon if they changed, unless
        a grant asked in the pass carries them."""
        if not lane.core.gated or granting:
            return
        exact = not lane.core.policy.by_weight  # no slack: a grown offset holds others back
        if self.heads(lane).outdated(self._published.get(lane.model), exact):
            self._changed.set()

    async def exchange(
        self, lane: Lane, ask: Ask | None = None, heads: Heads | None = None
    ) -> Grant:
        """One exchange with the pool's share: the heads published (this replica's own unless
        `heads` says), what is owed paid; first, those of its exchanges left unanswered."""
        try:
            await self._send_again(lane, heads)
            heads = heads if heads is not None else self.heads(lane)
            owed, nonce = lane.core.take_owed(), self.share.nonce()
            try:
                granted = await self.share.exchange(lane.model, heads, owed, ask, nonce)
            except BaseException:  # unreachable, or cancelled: it may have run
                self._unsure.setdefault(lane.model, []).append(Unsure(nonce, owed, ask))
                raise
        except ShareUnavailable:
            if self._metrics is not None:
                self._metrics.share_unreachable()
            raise
        self._published[lane.model] = heads
        return granted

    async def _send_again(self, lane: Lane, heads: Heads | None) -> None:
        """The pool's exchanges left unanswered, sent again under their nonces, oldest first,
        by this task alone: ShareUnavailable while another task sends them."""
        unsure = self._unsure.get(lane.model)
        if not unsure:
            return
        if lane.model in self._resending:
            raise ShareUnavailable("fair-share store unavailable")
        self._resending.add(lane.model)
        try:
            while unsure:
                sent = unsure[0]
                current = heads if heads is not None else self.heads(lane)
                grant = await self.share.exchange(lane.model, current, sent.owed, None, sent.nonce)
                unsure.remove(sent)
                if grant and sent.ask is not None:  # granted as it first ran: no call took it
                    lane.core.owe({sent.ask.tenant_id: -sent.ask.charge})
        finally:
            self._resending.discard(lane.model)

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

    async def close(self, lanes: Iterable[Lane]) -> None:
        """This replica leaves the pools' shares: one last exchange per gated pool it published
        in or owes to, with no heads, pays what is owed. Shielded, and given up (logged) past
        `FINAL_EXCHANGE_S`: what it could not pay stays charged."""
        gated = [lane for lane in lanes if lane.core.gated]
        with anyio.move_on_after(FINAL_EXCHANGE_S, shield=True):
            for lane in gated:
                unsure = self._unsure.get(lane.model)
                if not (lane.model in self._published or lane.core.owed or unsure):
                    continue  # never published, nothing owed: nothing to take out
                try:
                    await self.exchange(lane, heads=Heads((), {}))
                except ShareUnavailable:
                    log.warning("cannot pay what %s owes at close: store unreachable", lane.model)
        for lane in gated:
            unpaid = {**lane.core.owed}  # (the store was unreachable, or too slow)
            for sent in self._unsure.get(lane.model, []):
                for tenant, amount in sent.owed.items():
                    unpaid[tenant] = unpaid.get(tenant, 0.0) + amount
            if unpaid:
                log.warning("left unpaid in the share of %s: %s", lane.model, unpaid)
