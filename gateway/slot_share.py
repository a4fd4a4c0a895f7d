"""Each tenant's share of a pool's batch slots, and when the knee binds (`share_slots`).

Pure arithmetic over counts of calls: the dispatch core's book (`gateway.call_book`) counts
them from the calls it holds, and its yields (`gateway.yields`) act on the answers (who yields,
what room a call may take).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


def weighted_shares(
    tenants: Iterable[str], weights: Mapping[str, float], slots: int
) -> dict[str, float]:
    """Each tenant's share of `slots` by its weight (1 where it has none)."""
    weighed = {t: weights.get(t, 1.0) for t in tenants}
    total = sum(weighed.values())
    if total <= 0:
        return {}
    return {t: slots * w / total for t, w in weighed.items()}


def furthest_over(running: Counter[str], share: Mapping[str, float]) -> str | None:
    """The tenant furthest over its share that would still hold at least that share after
    giving a call up; None when none would (or none runs)."""
    if not running:
        return None
    over = max(running, key=lambda t: running[t] - share[t])
    return over if running[over] - 1 >= share[over] else None


@dataclass(frozen=True, slots=True)
class KneeBinding:
    """The knee while it binds: each tenant's calls running or being sent (not yielding), and
    each backlogged tenant's share of the knee's calls."""

    knee: int
    running: Counter[str]
    share: dict[str, float]
    sendable: Callable[[str], int]  # a tenant's ready calls that could be sent
    idle: frozenset[str]  # tenants with no call running whose own quota holds their calls back
    # some light tenant has a protected call (running or ready): only then are protected calls
    # held below the knee (a protected call never gives way to a sheddable one)
    holds_protected: bool = True

    def light(self, tenant_id: str) -> bool:
        """Fewer calls, running or ready, than its share of the knee's (and one may run)."""
        if tenant_id in self.idle:
            return False
        calls = self.running[tenant_id] + self.sendable(tenant_id)
        return 0 < calls < self.share.get(tenant_id, 0.0)

    def caps(self, tenant_id: str, sheddable: bool) -> bool:
        """Whether a call of the tenant may take only the slots below the knee."""
        return not self.light(tenant_id) and (sheddable or self.holds_protected)

    def lights(self) -> list[str]:
        """The light tenants, where another runs more than its share plus one; else none (the
        knee does not bind)."""
        if furthest_over(self.running, self.share) is None:
            return []
        return [t for t in self.share if self.light(t)]
