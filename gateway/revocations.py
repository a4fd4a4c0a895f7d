"""Keys revoked and tenants deleted while this process serves: whether a caller's credential was
withdrawn after it was checked.

Each RPC is stamped as its authentication begins (`stamp`, before the key is looked up); a
revocation notes the moment it happened. An admission that was under way across a revocation
(its stamp older than its key's revocation or its tenant's deletion) is undone when it returns,
however long its awaits (the quota, an idempotency key's lock, the store) took: a check taken
only once the handler ran would miss a revocation that came while the key was being looked up.
Pure: a counter for a clock, no I/O. Grows by one entry per revocation (an operator's act).
"""

from __future__ import annotations

import contextvars

STAMP: contextvars.ContextVar[int] = contextvars.ContextVar("fairgate_auth_stamp", default=0)


class Revocations:
    def __init__(self) -> None:
        self._now = 0
        self._at: dict[str, int] = {}  # key id, or "tenant <id>" -> when it was withdrawn

    def stamp(self) -> int:
        """The moment now: an authentication that begins now sees what was withdrawn before."""
        return self._now

    def key_revoked(self, key_id: str) -> None:
        self._now += 1
        self._at[key_id] = self._now

    def tenant_deleted(self, tenant_id: str) -> None:
        self._now += 1
        self._at[_tenant(tenant_id)] = self._now

    def since(self, stamp: int, tenant_id: str, key_id: str) -> str:
        """What of the caller's was withdrawn after `stamp`: "key", "tenant" or ""."""
        if self._at.get(_tenant(tenant_id), 0) > stamp:
            return "tenant"
        if key_id and self._at.get(key_id, 0) > stamp:
            return "key"
        return ""


def _tenant(tenant_id: str) -> str:
    return f"tenant {tenant_id}"
