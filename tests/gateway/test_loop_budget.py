"""A tenant's share of the event loop for its requests' work, on an injected clock."""

from __future__ import annotations

import pytest

from gateway.errors import LoopThrottled
from gateway.loop_budget import WINDOW_S, LoopBudget
from tests.fake_clock import FakeClock


def _spend(budget: LoopBudget, clock: FakeClock, tenant: str, seconds: float) -> None:
    with budget.spending(tenant):
        clock.now += seconds


def test_a_tenant_past_its_share_waits_until_it_refills_and_others_do_not() -> None:
    clock = FakeClock(0.0)
    budget = LoopBudget(share=0.05, clock=clock)  # holds 1 s
    _spend(budget, clock, "alpha", 0.9)
    _spend(budget, clock, "alpha", 2.1)  # one request may take as long as it takes
    with pytest.raises(LoopThrottled) as caught:
        _spend(budget, clock, "alpha", 0.001)
    # 1 - 0.9, then 2.1 s refilling 0.105 as it took 2.1: 1.895 s short, at 0.05 s a second
    assert caught.value.retry_after_s == pytest.approx(1.895 / 0.05)
    _spend(budget, clock, "beta", 0.5)
    clock.now += 1.895 / 0.05
    _spend(budget, clock, "alpha", 0.001)


def test_a_refused_piece_costs_nothing_and_a_failed_one_is_charged() -> None:
    clock = FakeClock(0.0)
    budget = LoopBudget(share=0.1, clock=clock)  # holds 2 s
    with pytest.raises(ValueError), budget.spending("alpha"):
        clock.now += 2.5
        raise ValueError("does not parse")
    for _ in range(3):
        with pytest.raises(LoopThrottled) as caught:
            _spend(budget, clock, "alpha", 10.0)
        assert caught.value.retry_after_s == pytest.approx(0.5 / 0.1)  # unchanged
    clock.now += 10 * WINDOW_S  # idle time fills it to its share of the window, no more
    _spend(budget, clock, "alpha", 3.0)
    with pytest.raises(LoopThrottled) as caught:
        _spend(budget, clock, "alpha", 0.1)
    assert caught.value.retry_after_s == pytest.approx(1.0 / 0.1)
