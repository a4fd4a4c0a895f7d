"""Token buckets, one per key, refilled continuously up to their capacity.

A bucket may go below zero: a cost known only once it is spent (the time a request took to
parse) is taken after the fact, and the key waits until its bucket is above zero again. Keys
are forgotten an hour after their last change (a forgotten key's bucket is full again), and at
most `KEYS_KEPT` are kept, the least recently changed going first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TTLCache

KEYS_KEPT = 65_536
KEPT_S = 3600.0


@dataclass(slots=True)
class _Bucket:
    level: float
    at: float


class Buckets:
    """`capacity` each, refilled at `per_s` a second."""

    def __init__(
        self, capacity: float, per_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity = capacity
        self.per_s = per_s
        self.clock = clock
        self._buckets: TTLCache[str, _Bucket] = TTLCache(KEYS_KEPT, KEPT_S, timer=clock)

    def level(self, key: str) -> float:
        bucket = self._buckets.get(key)
        if bucket is None:
            return self.capacity
        return min(self.capacity, bucket.level + (self.clock() - bucket.at) * self.per_s)

    def add(self, key: str, amount: float) -> None:
        """Put `amount` in the key's bucket (take it, when negative), up to its capacity."""
        self._buckets[key] = _Bucket(min(self.capacity, self.level(key) + amount), self.clock())

    def wait_s(self, key: str, level: float) -> float:
        """Seconds until the key's bucket holds `level` (0 when it does)."""
        return max(0.0, level - self.level(key)) / self.per_s
