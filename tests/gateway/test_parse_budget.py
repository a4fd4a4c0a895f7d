"""A tenant's share of the event loop spent parsing, on an injected clock."""

from __future__ import annotations

import pytest

from gateway.errors import ParseThrottled
from gateway.parse_budget import WINDOW_S, ParseBudget
from tests.fake_clock import FakeClock


def _parse(budget: ParseBudget, clock: FakeClock, tenant: str, seconds: float) -> None:
    with budget.parsing(tenant):
        clock.now += seconds


def test_a_tenant_past_its_share_waits_until_it_refills_and_others_do_not() -> None:
    clock = FakeClock(0.0)
    budget = ParseBudget(share=0.05, clock=clock)  # holds 1 s
    _parse(budget, clock, "alpha", 0.9)
    _parse(budget, clock, "alpha", 2.1)  # one request may take as long as it takes
    with pytest.raises(ParseThrottled) as caught:
        _parse(budget, clock, "alpha", 0.001)
    # 1 - 0.9, then 2.1 s refilling 0.105 as it took 2.1: 1.895 s short, at 0.05 s a second
    assert caught.value.retry_after_s == pytest.approx(1.895 / 0.05)
    _parse(budget, clock, "beta", 0.5)
    clock.now += 1.895 / 0.05
    _parse(budget, clock, "alpha", 0.001)


def test_a_refused_request_costs_nothing_and_a_failed_parse_is_charged() -> None:
    clock = FakeClock(0.0)
    budget = ParseBudget(share=0.1, clock=clock)  # holds 2 s
    with pytest.raises(ValueError), budget.parsing("alpha"):
        clock.now += 2.5
        raise ValueError("does not parse")
    for _ in range(3):
        with pytest.raises(ParseThrottled) as caught:
            _parse(budget, clock, "alpha", 10.0)
        assert caught.value.retry_after_s == pytest.approx(0.5 / 0.1)  # unchanged
    clock.now += 10 * WINDOW_S  # idle time fills it to its share of the window, no more
    _parse(budget, clock, "alpha", 3.0)
    with pytest.raises(ParseThrottled) as caught:
        _parse(budget, clock, "alpha", 0.1)
    assert caught.value.retry_after_s == pytest.approx(1.0 / 0.1)
