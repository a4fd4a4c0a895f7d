"""The circuit breaker, driven by a hand-moved clock."""

from __future__ import annotations

import pytest

from gateway.backends.breaker import BreakerState, CircuitBreaker
from tests.fake_clock import FakeClock


def make_breaker(failures: int = 3, cooldown_s: float = 10.0) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(clock, failures, cooldown_s), clock


def fail(breaker: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        breaker.failed(breaker.started())


def test_it_opens_after_the_threshold_of_failures_in_a_row_only() -> None:
    breaker, _ = make_breaker(failures=3)
    fail(breaker, 2)
    breaker.succeeded()  # resets the run
    fail(breaker, 2)
    assert breaker.state is BreakerState.CLOSED and breaker.allows()
    fail(breaker, 1)
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allows()


def test_after_the_cooldown_it_lets_one_trial_through_whose_success_closes_it() -> None:
    breaker, clock = make_breaker(failures=1, cooldown_s=10.0)
    fail(breaker, 1)
    clock.advance(9.99)
    assert not breaker.allows()
    clock.advance(0.01)
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allows()
    assert breaker.started()  # the trial
    assert not breaker.allows()  # one at a time
    assert not breaker.started()
    breaker.succeeded()
    assert breaker.state is BreakerState.CLOSED and breaker.allows()


def test_a_failed_trial_opens_it_for_another_cooldown() -> None:
    breaker, clock = make_breaker(failures=1, cooldown_s=10.0)
    fail(breaker, 1)
    clock.advance(10.0)
    trial = breaker.started()
    clock.advance(3.0)
    breaker.failed(trial)
    assert breaker.state is BreakerState.OPEN
    clock.advance(9.99)
    assert not breaker.allows()
    clock.advance(0.01)
    assert breaker.allows()


def test_an_abandoned_trial_frees_the_slot_for_the_next() -> None:
    breaker, clock = make_breaker(failures=1)
    fail(breaker, 1)
    clock.advance(10.0)
    trial = breaker.started()
    assert not breaker.allows()
    breaker.abandoned(trial)
    assert breaker.allows() and breaker.state is BreakerState.HALF_OPEN


def test_a_call_sent_before_it_opened_failing_late_cools_it_down_again_but_keeps_the_trial() -> (
    None
):
    breaker, clock = make_breaker(failures=2)
    early = breaker.started()  # sent while closed
    fail(breaker, 2)
    clock.advance(10.0)
    trial = breaker.started()
    assert trial and not early
    breaker.failed(early)  # the server still fails: another cool-down
    assert breaker.state is BreakerState.OPEN
    clock.advance(10.0)
    assert breaker.state is BreakerState.HALF_OPEN
    assert not breaker.allows()  # the first trial is still in flight
    breaker.abandoned(trial)
    assert breaker.allows()


@pytest.mark.parametrize(("failures", "cooldown_s"), [(0, 1.0), (1, -1.0)])
def test_nonsense_settings_are_refused(failures: int, cooldown_s: float) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(FakeClock(), failures, cooldown_s)
