"""Overload control's pure parts: how often the monitor is ticked."""

from __future__ import annotations

import pytest

from gateway.backends import BackendCapacity
from gateway.dispatch_core import DispatchCore
from gateway.lanes import Lane
from gateway.overload import TICK_S, OverloadControl, tick_interval
from gateway.slo import SloConfig, SloTarget
from tenants.policies import make_policy


def test_short_ticks_come_every_tick_period() -> None:
    assert tick_interval(0.0) == tick_interval(TICK_S / 20) == TICK_S


@pytest.mark.parametrize("spent", [0.05, 0.2, 1.0])
def test_long_ticks_take_a_tenth_of_the_time_at_most(spent: float) -> None:
    interval = tick_interval(spent)
    assert interval > TICK_S
    assert spent / (spent + interval) == pytest.approx(0.1)


def first_token(control: OverloadControl, call_id: str, ttft_s: float, now: float) -> None:
    """A protected call's first token, as the dispatcher reports it."""
    control._apply(control.monitor.first_token(call_id, "t", False, ttft_s, now))


class Serving:
    """A backend that shows the same room whenever asked."""

    def __init__(self, room: BackendCapacity) -> None:
        self.name, self.room = "x", room

    def capacity(self) -> BackendCapacity:
        return self.room


@pytest.mark.parametrize("busy", [8, 7, 6, 0])
def test_a_busy_pool_holding_nothing_back_lets_the_level_fall(busy: int) -> None:
    """Past level 1 a pool with no more free slots than the reserve kept the level up, misses
    or not: a well-used pool stayed at the level it once reached (at level 2 a quarter of
    every batch idle for good, at 3 new jobs refused while most slots were busy)."""
    now = [0.0]
    room = BackendCapacity(1000, 16, free_slots=8 - busy, running=busy, waiting=0, healthy=True)
    lane = Lane("m", {"x": Serving(room)}, DispatchCore(make_policy("justitia")), None)  # type: ignore[dict-item]
    config = SloConfig(
        (SloTarget("*", ttft_s=1.0, tpot_s=0.1),),
        window_s=10.0, threshold=0.2, min_calls=5, hold_s=2.0, rise_s=0.25,
    )  # fmt: skip
    control = OverloadControl(config, [lane], lambda: now[0], lambda: None)
    for i in range(10):  # a burst of first tokens far past their target: the level rises
        now[0] = 0.01 * i
        first_token(control, f"late{i}", 5.0, now[0])
    assert control.level >= 1
    for i in range(1200):  # two minutes of first tokens on time, nothing waiting
        now[0] = 1.0 + 0.1 * i
        first_token(control, f"on-time{i}", 0.05, now[0])
        control.tick()
    assert control.level == 0 and lane.core.batch_fraction == 1.0
