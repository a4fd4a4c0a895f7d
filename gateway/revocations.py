"""Keys revoked and tenants deleted while this process serves: whether a caller's credential was
withdrawn after it was checked.

Each RPC is stamped as its authentication begins (`stamp`, before the key is looked up); a
revocation notes the moment it happened. An admission that was under way across a revocation
(its stamp older than its key's revocation or its tenant's deletion) is undone when it returns,
however long its awaits (the quota, an idempotency key's lock, the store) took: a check taken
only once the handler ran would miss a revocation that came while the key was being looked up.
Pure: a counter for a clock, no I/O. One entry per key or tenant withdrawn, the latest `kept`
of them: an operator may revoke and delete without end (ids that never existed included, as a
retry's clean-up runs for what is gone). A stamp older than the newest entry forgotten is
answered as withdrawn, since what it missed is unknown: an RPC refused that way had its
authentication under way across `kept` revocations.
"""

from __future__ import annotations

import contextvars

STAMP: contextvars.ContextVar[int] = contextvars.ContextVar("fairgate_auth_stamp", default=0)
KEPT = 65_536  # withdrawals remembered


class Revocations:
    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._now = 0
        # key id, or "tenant <id>" -> when it was withdrawn, oldest first
        self._at: dict[str, int] = {}
        self._forgotten = 0  # when the newest entry forgotten was withdrawn

    def stamp(self) -> int:
        """The moment now: an authentication that begins now sees what was withdrawn before."""
        return self._now

    def key_revoked(self, key_id: str) -> None:
        self._withdraw(key_id)

    def tenant_deleted(self, tenant_id: str) -> None:
        self._withdraw(_tenant(tenant_id))

    def since(self, stamp: int, tenant_id: str, key_id: str) -> str:
        """What of the caller's was withdrawn after `stamp`: "key", "tenant" or "" ("key" too
        for a stamp older than what is remembered)."""
        if self._at.get(_tenant(tenant_id), 0) > stamp:
            return "tenant"
        if key_id and self._at.get(key_id, 0) > stamp:
            return "key"
        if stamp < self._forgotten:
            return "key"  # unknown: refused, as if withdrawn
        return ""

    def _withdraw(self, name: str) -> None:
        self._now += 1
        self._at.pop(name, None)  # to the end: the entries stay in the order of their times
        self._at[name] = self._now
        if len(self._at) > self.kept:
            self._forgotten = self._at.pop(next(iter(self._at)))


def _tenant(tenant_id: str) -> str:
    return f"tenant {tenant_id}"
