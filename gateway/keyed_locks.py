"""One lock per key, kept only while someone holds it or waits for it: keys come and go (tenants,
idempotency keys) and a lock per key ever seen would only grow.

The users of a key are counted before the first await: a lock that showed idle between a task
fetching it and that task's turn, and was dropped then, would let a second holder in beside it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

import anyio


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[anyio.Lock, int]] = {}  # key -> (lock, its users)

    def __len__(self) -> int:
        """The keys held or waited for now."""
        return len(self._locks)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._locks

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (anyio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
