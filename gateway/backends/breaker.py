"""A per-backend circuit breaker: stop sending to a backend that keeps failing, then try again.

Algorithm: CLOSED counts consecutive failures (a success resets the count); `failure_threshold`
in a row OPEN it. OPEN lets nothing through until `cooldown_s` has passed since it opened; then
it is HALF_OPEN and lets one trial call through. The trial's success closes the breaker, its
failure opens it again for another cool-down, and a trial that ends with neither (the gateway
aborted it) frees the slot for the next trial. Pure: time comes from the injected clock and
nothing else is read, so tests drive it by hand.
Invariant: at most one trial call is in flight while the breaker is not CLOSED.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class BreakerState(enum.Enum):
    CLOSED = "closed"  # calls go through
    OPEN = "open"  # nothing goes through until the cool-down has passed
    HALF_OPEN = "half_open"  # one trial call goes through


class CircuitBreaker:
    def __init__(
        self, clock: Callable[[], float], failure_threshold: int = 5, cooldown_s: float = 10.0
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        if cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0, got {cooldown_s}")
        self._clock = clock
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._failures = 0  # consecutive, while CLOSED
        self._opened_at: float | None = None  # None: CLOSED
        self._trial_in_flight = False

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at < self.cooldown_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def allows(self) -> bool:
        """Whether a call may be sent now (while half-open: only when no trial is in flight)."""
        state = self.state
        if state is BreakerState.HALF_OPEN:
            return not self._trial_in_flight
        return state is BreakerState.CLOSED

    def started(self) -> bool:
        """A call was sent; True when it is the half-open breaker's trial, whose outcome (or
        `abandoned`) must then be reported."""
        if self.state is BreakerState.HALF_OPEN and not self._trial_in_flight:
            self._trial_in_flight = True
            return True
        return False

    def succeeded(self) -> None:
        """A call got through: the backend works, whichever call it was."""
        self._failures = 0
        self._opened_at = None
        self._trial_in_flight = False

    def failed(self, trial: bool) -> None:
        """A call failed on the backend; `trial` is what `started` returned for it."""
        if trial:
            self._trial_in_flight = False
        if self._opened_at is not None:  # a failure while open or half-open: cool down again
            self._opened_at = self._clock()
            return
        self._failures += 1
        if self._failures >= self.failure_threshold:
            self._opened_at = self._clock()

    def abandoned(self, trial: bool) -> None:
        """A call ended with no verdict on the backend (aborted by the gateway, refused)."""
        if trial:
            self._trial_in_flight = False
