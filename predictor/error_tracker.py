"""Per-tenant prediction error over a sliding window, and the conservative-mode switch.

For each tenant the tracker keeps the last `window` finished calls' absolute log error
`|log1p(true) - log1p(p50)|` and whether the true length fell at or under the predicted p90,
with running sums so an update and a query are O(1). A tenant whose window holds at least
`min_samples` calls is *conservative* when its mean log error exceeds `error_threshold` or its
p90 coverage falls below `coverage_floor`; policies then plan with the p90 instead of the p50.
Tenants are kept in LRU order and dropped past `max_tenants`. Invariant: each running sum
equals the sum over its window.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from predictor.distribution import LengthDistribution
from predictor.errors import InvalidCall


@dataclass(frozen=True, slots=True)
class ErrorStats:
    count: int
    mean_abs_log_error: float  # 0 with no samples; 0.69 means typically a factor 2 off
    p90_coverage: float  # share of true lengths <= predicted p90; 1 with no samples
    conservative: bool


class _Window:
    __slots__ = ("covered", "errors", "items")

    def __init__(self, size: int) -> None:
        self.items: deque[tuple[float, bool]] = deque(maxlen=size)
        self.errors = 0.0
        self.covered = 0

    def add(self, error: float, covered: bool) -> None:
        if len(self.items) == self.items.maxlen:
            old_error, old_covered = self.items[0]
            self.errors -= old_error
            self.covered -= old_covered
        self.items.append((error, covered))
        self.errors += error
        self.covered += covered


class ErrorTracker:
    def __init__(
        self,
        *,
        window: int = 200,
        min_samples: int = 20,
        error_threshold: float = 0.9,
        coverage_floor: float = 0.75,
        max_tenants: int = 100_000,
    ) -> None:
        if window < 1 or not 1 <= min_samples <= window or max_tenants < 1:
            raise InvalidCall("need window >= 1, 1 <= min_samples <= window, max_tenants >= 1")
        self.window, self.min_samples = window, min_samples
        self.error_threshold, self.coverage_floor = error_threshold, coverage_floor
        self.max_tenants = max_tenants
        self._tenants: OrderedDict[str, _Window] = OrderedDict()

    def record(self, tenant_id: str, prediction: LengthDistribution, true_len: int) -> None:
        if true_len < 0:
            raise InvalidCall(f"true_len must be >= 0, got {true_len}")
        win = self._tenants.get(tenant_id)
        if win is None:
            win = self._tenants[tenant_id] = _Window(self.window)
            if len(self._tenants) > self.max_tenants:
                self._tenants.popitem(last=False)
        else:
            self._tenants.move_to_end(tenant_id)
        error = abs(math.log1p(true_len) - math.log1p(prediction.p50))
        win.add(error, true_len <= prediction.p90)

    def stats(self, tenant_id: str) -> ErrorStats:
        win = self._tenants.get(tenant_id)
        if win is None or not win.items:
            return ErrorStats(0, 0.0, 1.0, False)
        n = len(win.items)
        error, coverage = max(win.errors, 0.0) / n, win.covered / n
        conservative = n >= self.min_samples and (
            error > self.error_threshold or coverage < self.coverage_floor
        )
        return ErrorStats(n, error, coverage, conservative)

    def conservative(self, tenant_id: str) -> bool:
        return self.stats(tenant_id).conservative

    def planning_quantile(self, tenant_id: str) -> float:
        """The quantile policies should plan with: 0.9 when conservative, else 0.5."""
        return 0.9 if self.conservative(tenant_id) else 0.5

    def planning_length(self, tenant_id: str, prediction: LengthDistribution) -> float:
        return prediction.p90 if self.conservative(tenant_id) else prediction.p50
