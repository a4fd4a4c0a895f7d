"""How many of something each tenant holds at once, counted while a block runs, with a limit.

Open streams and submissions under way are both counted so (and the characters of the jobs
being admitted, `adding` any amount): `holding` refuses one past the tenant's limit before any
work (the refusal is the caller's, with its QUOTA_* reason), counts it while the block runs, and
forgets a tenant whose count is back to 0, so the map holds only tenants with something under
way. Invariant: a tenant's count is the sum of what the blocks of
it running now count.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

from tenants import QuotaExceeded


class TenantCounts:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    @contextlib.contextmanager
    def holding(
        self, tenant_id: str, limit: int, refusal: Callable[[str, int, int], QuotaExceeded]
    ) -> Iterator[None]:
        """Count one for the tenant while the block runs; `limit` 0 means no limit, and one
        past it raises `refusal(tenant_id, limit, count)`."""
        count = self._counts[tenant_id]
        if 0 < limit <= count:
            raise refusal(tenant_id, limit, count)
        with self.adding(tenant_id, 1):
            yield

    @contextlib.contextmanager
    def adding(self, tenant_id: str, amount: int) -> Iterator[None]:
        """Count `amount` for the tenant while the block runs (the caller checks its limit)."""
        self._counts[tenant_id] += amount
        try:
            yield
        finally:
            self._counts[tenant_id] -= amount
            if not self._counts[tenant_id]:
                del self._counts[tenant_id]

    def __getitem__(self, tenant_id: str) -> int:
        return self._counts[tenant_id]
