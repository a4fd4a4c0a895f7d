"""One pool's order across gateway replicas, kept in Redis and granted call by call.

With the redis store every replica is fair to the whole deployment, not only to the jobs it
happens to own, and orders its calls as one gateway would. Each pool's service counters live in
Redis: per tenant, the KV token-time its calls took divided by its weight (VTC's counter over
the cost unit of docs/ARCHITECTURE.md §3). A replica publishes the tenants it has work for
(`active`: ready, being sent or running) and, among them, those with a call it could send now
(`waiting`: not held by a quota, and some backend of the pool serving in the replica's view),
each with an offset; each entry lapses `ttl_s` after it was published, so a dead replica's
tenants stop counting within it.

One order for the pool: a job's *key* is its tenant's counter plus the job's offset (the
policy's `pool_offsets`: with justitia the predicted cost of its calls not yet granted per unit
of weight; 0 with vtc, which orders tenants only). Under GPS every backlogged tenant's counter
advances alike, so the key is the job's fair-share finish in the pool's units were it its
tenant's only job, comparable across replicas: justitia's completion order made global, where
each replica's own tags see only the jobs it owns. A waiting tenant is published, and asks, at
the least offset of its jobs there. Before it sends a call a replica asks for a grant:
`share.lua` grants it and charges its worst-case cost, unless the call's key leads the lowest
key waiting anywhere in the pool (other tenants, and its own tenant on other replicas) by more
than `slack` mean charges; then the call waits and the replica sends its other tenants' calls,
while the replica holding the lowest key takes the room. When the call ends, what it used beyond
its grant (or short of it; everything for a call that never ran) is paid with the next exchange.
A tenant that becomes active is lifted to the least-served active tenant (to the most-served
with none active), so idle time banks no credit.

A policy that does not share by weight (fcfs, las) charges nothing, so every counter stays 0:
the key is the job's own key in the policy's order (its arrival, its attained service), and as
the mean charge is 0 the slack is too: the pool serves first come, first served (or least
attained first) as one gateway would, where each replica alone would serve only its own jobs
in that order and the server would interleave the replicas' queues.

Why a slack: justitia's own guarantee lets a job end up to one largest call's service after its
fair-share finish, so its order needs some room to pick; one mean call's lead leaves each
replica's order that room while the split of a saturated pool stays within 10 % of the weights
over a few seconds (a lead of 4 split it 13 % off: docs/BENCHMARKS.md, "Replicas"). Within the
slack each replica's policy keeps its order (justitia's tags, its knee and chain rules) over the
jobs it owns.

Redis unreachable: no grant, so no new dispatch (fail closed); a call waits for the store as a
reserve does (`reserve_deadline_s`) and then fails. A reply lost: the client sends the command
once more, so each exchange carries a nonce (the replica, its process, a sequence) under which
the script keeps its reply `REPLY_TTL_S`, and answers the same exchange sent again with it
instead of charging or paying twice. Keys carry the pool as hash tag and the policy (replicas of
different policies do not share an order): `<prefix>:{pool:<model>}:<policy>:counters`,
`:active`, `:waiting`, and `:reply:<nonce>`.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from gateway.errors import ShareUnavailable
from tenants.redis_client import RedisClient, fails_closed

ENTRY_TTL_S = 2.0  # a published tenant counts this long; republished every third of it
SLACK_CALLS = 1.0  # the lead a tenant may take, in mean charges of a grant
# how long an exchange's reply is kept for the same exchange sent again (four socket timeouts
# when that is more: the client's retry reaches the store within about two of the first send)
REPLY_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class Heads:
    """The tenants a replica has work for in one pool."""

    active: tuple[str, ...]  # ready, being sent or running calls
    # the tenants with a ready call no quota holds (it could be sent now), each with the least
    # offset of its jobs with such a call
    waiting: Mapping[str, float]

    def outdated(self, published: Heads | None, exact: bool = False) -> bool:
        """Whether these heads must be published at once in place of `published`: a tenant
        came, began or stopped waiting, or one of its jobs here now comes earlier in the pool's
        order. A tenant gone from here and an offset that grew go with the next exchange (within
        a third of the heads' lifetime): meanwhile the others only defer a little longer to a
        tenant that asks for its calls as soon as it has room, and the pool takes the tenant
        gone for active a moment longer (it is not lifted should it come back meanwhile). With
        `exact` (a policy that does not share by weight: no slack) an offset that grew goes at
        once too, as the stale lower key would hold every other replica back outright."""
        if published is None or not set(self.active) <= set(published.active):
            return True
        if self.waiting.keys() != published.waiting.keys():
            return True
        if exact:
            return self.waiting != published.waiting
        return any(offset < published.waiting[t] for t, offset in self.waiting.items())


@dataclass(frozen=True, slots=True)
class Grant:
    """The answer to an exchange: granted or not, and where a granted call stands in the pool's
    order (its key: a server that schedules by priority runs it by this)."""

    granted: bool
    key: float = 0.0

    def __bool__(self) -> bool:
        return self.granted


@dataclass(frozen=True, slots=True)
class Ask:
    """A grant asked for one call: its tenant, its charge (worst-case cost / weight) and the
    offset its tenant asks at."""

    tenant_id: str
    charge: float
    offset: float = 0.0


def _source() -> str:
    lua = resources.files("gateway") / "lua"
    return (lua / "_lib.lua").read_text() + "\n" + (lua / "share.lua").read_text()


_fails_closed = fails_closed(ShareUnavailable, "fair-share store")


class RedisShare(RedisClient):
    def __init__(
        self,
        url: str,
        replica_id: str,
        policy: str,
        *,
        ttl_s: float = ENTRY_TTL_S,
        slack_calls: float = SLACK_CALLS,
        prefix: str = "fg",
        socket_timeout_s: float = 2.0,
    ) -> None:
        super().__init__(url, 8, socket_timeout_s, socket_timeout_s)
        if " " in replica_id:
            raise ValueError(f"a replica id holds no space, got {replica_id!r}")
        self.replica_id = replica_id
        self.policy = policy
        self.ttl_s = ttl_s
        self.slack_calls = slack_calls
        self._prefix = prefix
        self._script = self._redis.register_script(_source())
        self._reply_ttl_ms = int(max(REPLY_TTL_S, 4 * socket_timeout_s) * 1000)
        # a nonce names one exchange, across replicas and a replica's restarts
        self._process = uuid.uuid4().hex[:12]
        self._sequence = itertools.count()

    def keys(self, pool: str) -> list[str]:
        base = self._base(pool)
        return [f"{base}:counters", f"{base}:active", f"{base}:waiting"]

    def _base(self, pool: str) -> str:
        return f"{self._prefix}:{{pool:{pool}}}:{self.policy}"

    def nonce(self) -> str:
        """A name for one exchange of this replica's that no other exchange has."""
        return f"{self.replica_id}:{self._process}:{next(self._sequence)}"

    @_fails_closed
    async def exchange(
        self,
        pool: str,
        heads: Heads,
        owed: Mapping[str, float],
        ask: Ask | None = None,
        nonce: str | None = None,
    ) -> Grant:
        """Publish this replica's heads in the pool, pay what is owed, and answer `ask`: granted
        (its charge counted) with its key, or not when it must wait (or nothing was asked).
        Under a `nonce` an exchange already made (within `REPLY_TTL_S`) is answered as it was,
        and does nothing more; by default a fresh one."""
        nonce = nonce if nonce is not None else self.nonce()
        keys = [*self.keys(pool), f"{self._base(pool)}:reply:{nonce}"]
        args: list[str | float | int] = [
            self.replica_id,
            int(self.ttl_s * 1000),
            self.slack_calls,
            ask.tenant_id if ask is not None else "",
            ask.charge if ask is not None else 0.0,
            ask.offset if ask is not None else 0.0,
            self._reply_ttl_ms,
            len(heads.active),
            *heads.active,
            len(heads.waiting),
        ]
        for tenant, offset in sorted(heads.waiting.items()):
            args += [tenant, repr(offset)]
        for tenant, amount in owed.items():
            args += [tenant, repr(amount)]
        reply = await self._script(keys=keys, args=args)
        if int(reply[0]) != 1:
            return Grant(False)
        return Grant(True, float(reply[1]))

    @_fails_closed
    async def counters(self, pool: str) -> dict[str, float]:
        """Each tenant's service per unit of weight in the pool (for tests and benchmarks)."""
        fields: dict[str, str] = await self._redis.hgetall(self.keys(pool)[0])  # type: ignore[assignment]
        return {t: float(v) for t, v in fields.items() if not t.startswith("~")}
