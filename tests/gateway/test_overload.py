"""Overload control's pure parts: how often the monitor is ticked."""

from __future__ import annotations

import pytest

from gateway.overload import TICK_S, tick_interval


def test_short_ticks_come_every_tick_period() -> None:
    assert tick_interval(0.0) == tick_interval(TICK_S / 20) == TICK_S


@pytest.mark.parametrize("spent", [0.05, 0.2, 1.0])
def test_long_ticks_take_a_tenth_of_the_time_at_most(spent: float) -> None:
    interval = tick_interval(spent)
    assert interval > TICK_S
    assert spent / (spent + interval) == pytest.approx(0.1)
