"""Per-tenant prediction error over a sliding window, and the conservative-mode switch.

For each tenant (in the gateway: a tenant's kind of call) the tracker keeps the last `window`
finished calls' absolute log error `|log1p(true) - log1p(p50)|`, whether the true length fell at
or under the predicted p90, the true length and the tokens produced past the p90, with running
sums so an update and a query are O(1). A tenant is *conservative* when its window holds at
least `min_samples` calls and its mean log error exceeds `error_threshold`, its p90 coverage
falls below `coverage_floor` or over `excess_threshold` of its output tokens came past their
calls' p90, or at once when its last `streak` calls that could run past their p90 all did (for a
calibrated p90, a chance of 0.1 to the power `streak`). Tokens, not only calls, and only calls
that could have overrun: a tenant mixing cheap calls among its lies (one token asked, or a p90
at max_tokens) would otherwise keep its coverage up and break every streak, and keep its head
start for good, while one long call's excess outweighs many cheap calls'. For a calibrated p90
the excess is a few percent of the tokens (7 % for log-normal lengths of sigma 0.6, 17 % at
sigma 1). A call counts as past its p90 the moment it gets there (`overrun`), not when it ends:
a tenant whose calls are predicted short and run long is caught after `streak` such calls have
started, not after `min_samples` have finished. A conservative tenant is planned at the larger
of the predicted p90 and the p90 of what its calls in the window produced, a call still running
past its p90 counting at its max_tokens (what it may yet use): predictions that keep missing are
widened to what the tenant is seen to run, so a lie loses its head start; `record` and
`overrun` say when they turn a tenant conservative, so that its calls planned before and still
waiting are planned again (`CallPlanner.widen`). Tenants are kept in
LRU order and dropped past `max_tenants`. Invariant: each running sum equals the sum over its
window.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from predictor.distribution import LengthDistribution
from predictor.errors import InvalidCall


@dataclass(frozen=True, slots=True)
class ErrorStats:
    count: int
    mean_abs_log_error: float  # 0 with no samples; 0.69 means typically a factor 2 off
    p90_coverage: float  # share of true lengths <= predicted p90; 1 with no samples
    conservative: bool
    overrunning: int = 0  # calls running past their p90 now (counted by `overrun`)
    excess_share: float = 0.0  # share of the output tokens produced past their calls' p90


class _Window:
    __slots__ = ("_p90", "covered", "errors", "excess", "items", "misses", "open", "tokens")

    def __init__(self, size: int) -> None:
        self.items: deque[tuple[float, int, float]] = deque(maxlen=size)  # error, length, excess
        self.errors = 0.0
        self.covered = 0
        self.tokens = 0  # output tokens in the window
        self.excess = 0.0  # of them, those past their call's p90
        self.misses = 0  # calls past their p90 in a row, the latest last
        # the max_tokens of calls running past their p90 (bounded: a call that never ends
        # ages out instead of staying forever)
        self.open: deque[int] = deque(maxlen=size)
        self._p90: float | None = None  # cached until the window changes

    def add(
        self, error: float, excess: float, true_len: int, counted: bool, could_overrun: bool
    ) -> None:
        """A finished call; `counted` when it was counted past its p90 while it ran."""
        if len(self.items) == self.items.maxlen:
            old_error, old_len, old_excess = self.items[0]
            self.errors -= old_error
            self.covered -= old_excess == 0
            self.tokens -= old_len
            self.excess -= old_excess
        covered = excess == 0
        self.items.append((error, true_len, excess))
        self.errors += error
        self.covered += covered
        self.tokens += true_len
        self.excess += excess
        if not covered:
            self.misses += not counted
        elif could_overrun:  # a call that could not run past its p90 proves nothing
            self.misses = 0
        self._p90 = None

    def overrun(self, max_tokens: int) -> None:
        self.misses += 1
        self.open.append(max_tokens)
        self._p90 = None

    def close(self, max_tokens: int) -> None:
        if max_tokens in self.open:
            self.open.remove(max_tokens)
            self._p90 = None

    def observed_p90(self) -> float:
        if self._p90 is None:
            lengths = [n for _, n, _ in self.items] + list(self.open)
            self._p90 = float(np.quantile(lengths, 0.9)) if lengths else 0.0
        return self._p90


class ErrorTracker:
    def __init__(
        self,
        *,
        window: int = 200,
        min_samples: int = 20,
        error_threshold: float = 0.9,
        coverage_floor: float = 0.75,
        excess_threshold: float = 0.3,
        streak: int = 3,
        max_tenants: int = 100_000,
    ) -> None:
        if window < 1 or not 1 <= min_samples <= window or max_tenants < 1:
            raise InvalidCall("need window >= 1, 1 <= min_samples <= window, max_tenants >= 1")
        if not 1 <= streak <= window:
            raise InvalidCall("need 1 <= streak <= window")
        self.window, self.min_samples, self.streak = window, min_samples, streak
        self.error_threshold, self.coverage_floor = error_threshold, coverage_floor
        self.excess_threshold = excess_threshold
        self.max_tenants = max_tenants
        self._tenants: OrderedDict[str, _Window] = OrderedDict()

    def record(
        self,
        tenant_id: str,
        prediction: LengthDistribution,
        true_len: int,
        overran_max_tokens: int | None = None,
        max_tokens: int | None = None,
    ) -> bool:
        """A call finished with `true_len` tokens; `overran_max_tokens`: its max_tokens, when
        `overrun` counted it while it ran (it is not counted twice); `max_tokens`: its cap, when
        known (a call capped at its p90 or under cannot run past it). True when this turned the
        tenant conservative."""
        if true_len < 0:
            raise InvalidCall(f"true_len must be >= 0, got {true_len}")
        was = self.conservative(tenant_id)
        win = self._window(tenant_id)
        if overran_max_tokens is not None:
            win.close(overran_max_tokens)
        error = abs(math.log1p(true_len) - math.log1p(prediction.p50))
        excess = max(true_len - prediction.p90, 0.0)
        could_overrun = max_tokens is None or max_tokens > prediction.p90
        win.add(error, excess, true_len, overran_max_tokens is not None, could_overrun)
        return not was and self.conservative(tenant_id)

    def overrun(self, tenant_id: str, max_tokens: int) -> bool:
        """A call still running has just produced more than its predicted p90. True when this
        turned the tenant conservative."""
        was = self.conservative(tenant_id)
        self._window(tenant_id).overrun(max_tokens)
        return not was and self.conservative(tenant_id)

    def _window(self, tenant_id: str) -> _Window:
        win = self._tenants.get(tenant_id)
        if win is None:
            win = self._tenants[tenant_id] = _Window(self.window)
            if len(self._tenants) > self.max_tenants:
                self._tenants.popitem(last=False)
        else:
            self._tenants.move_to_end(tenant_id)
        return win

    def stats(self, tenant_id: str) -> ErrorStats:
        win = self._tenants.get(tenant_id)
        if win is None:
            return ErrorStats(0, 0.0, 1.0, False)
        if not win.items:
            return ErrorStats(0, 0.0, 1.0, win.misses >= self.streak, len(win.open))
        n = len(win.items)
        error, coverage = max(win.errors, 0.0) / n, win.covered / n
        excess = max(win.excess, 0.0) / win.tokens if win.tokens > 0 else 0.0
        conservative = win.misses >= self.streak or (
            n >= self.min_samples
            and (
                error > self.error_threshold
                or coverage < self.coverage_floor
                or excess > self.excess_threshold
            )
        )
        return ErrorStats(n, error, coverage, conservative, len(win.open), excess)

    def conservative(self, tenant_id: str) -> bool:
        return self.stats(tenant_id).conservative

    def planning_quantile(self, tenant_id: str) -> float:
        """The quantile policies should plan with: 0.9 when conservative, else 0.5."""
        return 0.9 if self.conservative(tenant_id) else 0.5

    def planning_length(self, tenant_id: str, prediction: LengthDistribution) -> float:
        """The p50 normally; when conservative, `widened`."""
        widened = self.widened(tenant_id, prediction)
        return prediction.p50 if widened is None else widened

    def widened(self, tenant_id: str, prediction: LengthDistribution) -> float | None:
        """None unless the tenant is conservative; then the p90 widened to what its calls in
        the window produced (the p90 of their true lengths) where that is more."""
        if not self.conservative(tenant_id):
            return None
        return max(prediction.p90, self._tenants[tenant_id].observed_p90())
