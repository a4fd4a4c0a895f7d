"""The SLO monitor alone: verdicts over a window, levels up and down, held between changes."""

from __future__ import annotations

import pytest

from gateway.slo import SloConfig, SloMonitor, SloTarget, expected_waits

TARGETS = (SloTarget("*", ttft_s=1.0, tpot_s=0.1), SloTarget("vip", ttft_s=0.2))


def monitor(**overrides: float) -> SloMonitor:
    config = {"window_s": 10.0, "threshold": 0.2, "min_calls": 5, "hold_s": 1.0, "rise_s": 1.0}
    config |= overrides
    return SloMonitor(SloConfig(TARGETS, **config), now=0.0)  # type: ignore[arg-type]


def test_misses_past_the_threshold_raise_the_level_one_step_per_hold() -> None:
    m = monitor()
    for i in range(5):
        assert m.first_token("c", "t", False, 0.5, now=0.1 * i) == 0  # all within 1 s
    assert m.violation_rate(0.5) == 0.0
    for i in range(5):
        m.first_token("c", "t", False, 3.0, now=1.0 + 0.01 * i)  # 5 of 10 miss
    assert m.level == 1
    assert m.first_token("c", "t", False, 3.0, now=1.5) == 1  # held: one step per second
    assert m.update(2.1) == 2
    assert m.update(3.2) == 3 and m.update(9.0) == 3  # the top level


def test_the_level_falls_when_misses_fall_below_half_the_threshold_or_calls_stop() -> None:
    m = monitor()
    for i in range(10):
        m.first_token("c", "t", False, 3.0, now=0.01 * i)  # level 1 once 5 verdicts are in
    assert m.update(1.0) == 1  # held for a second
    for i in range(40):
        m.first_token("c", "t", False, 0.1, now=1.1 + 0.01 * i)  # still 10 of 11 missed at 1.1
    assert m.update(2.2) == 2  # 10 of 50 missed: not over 20 %, not under 10 % either
    for i in range(100):
        m.first_token("c", "t", False, 0.1, now=2.3 + 0.01 * i)  # under 10 % from 2.81 on
    assert m.update(3.4) == 1  # stepped down at 2.81, held since
    assert m.update(30.0) == 0  # nothing in the window: nothing to show overload


def test_a_level_that_still_acts_does_not_step_down() -> None:
    m = monitor()
    for i in range(10):
        m.first_token("c", "t", False, 3.0, now=0.01 * i)
    assert m.level == 1
    m.acted(15.0, 1)  # it refused a job (or found the room full) with no miss in the window
    assert m.update(15.5) == 1 and m.update(15.9) == 1  # within hold_s of its last act
    m.acted(16.5, 1)
    assert m.update(17.0) == 1
    assert m.update(17.6) == 0  # idle for hold_s: the load it held back has gone


def test_each_tenant_is_judged_by_its_own_target_and_sheddable_calls_not_at_all() -> None:
    m = monitor(min_calls=1)
    m.first_token("c", "vip", False, 0.5, now=0.0)  # vip's target is 0.2 s
    m.first_token("c", "t", False, 0.5, now=0.0)  # everyone else's is 1 s
    m.first_token("c", "t", True, 99.0, now=0.0)  # sheddable: not judged
    assert m.violation_rate(0.0) == 0.5
    m.ended("c", "t", False, 0.5, now=0.0, pool="")  # per-token target 0.1 s
    m.ended("c", "vip", False, 0.5, now=0.0, pool="")  # vip has no per-token target
    m.ended("c", "t", False, None, now=0.0, pool="")  # one token: nothing to judge
    assert m.violation_rate(0.0) == pytest.approx(2 / 3)


def test_verdicts_leave_the_window() -> None:
    m = monitor(min_calls=1, window_s=5.0)
    m.first_token("c", "t", False, 3.0, now=0.0)
    assert m.violation_rate(4.9) == 1.0 and m.violation_rate(5.1) is None


@pytest.mark.parametrize(
    "bad",
    [{"threshold": 0.0}, {"threshold": 1.0}, {"window_s": 0.0}, {"min_calls": 0}],
)
def test_nonsense_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        monitor(**bad)
    with pytest.raises(ValueError, match="times must be > 0"):
        SloConfig((SloTarget("*", ttft_s=0.0),))


def test_a_call_waiting_past_its_target_is_a_miss_at_once_and_only_once() -> None:
    m = monitor(min_calls=1)
    m.overdue("slow", "t", False, waited_s=0.5, now=0.0)  # within its 1 s target: nothing
    assert m.violation_rate(0.0) is None
    m.overdue("slow", "t", False, waited_s=1.5, now=0.5)
    m.overdue("slow", "t", False, waited_s=2.5, now=1.5)  # judged already
    m.overdue("shed", "t", True, waited_s=9.0, now=1.5)  # sheddable: never judged
    assert m.violation_rate(1.5) == 1.0
    m.first_token("slow", "t", False, 3.0, now=2.0)  # its miss is counted once
    m.first_token("fast", "t", False, 0.1, now=2.0)
    assert m.violation_rate(2.0) == 0.5


def test_it_rises_quickly_and_steps_down_slowly() -> None:
    m = monitor(min_calls=1, rise_s=0.1, hold_s=2.0, window_s=1.0)
    for i in range(4):
        m.first_token("c", "t", False, 3.0, now=0.1 * i)
    assert m.level == 3  # a step each 0.1 s
    assert m.update(1.5) == 3  # the misses have left the window, but a level holds 2 s
    assert m.update(2.4) == 2 and m.update(3.0) == 2 and m.update(4.4) == 1


def test_tokens_are_slow_when_most_misses_are_per_token_ones() -> None:
    m = monitor(min_calls=1)
    m.first_token("a", "t", False, 3.0, now=0.0)  # a slow first token
    assert not m.tokens_slow(0.0)
    m.ended("a", "t", False, 0.5, now=0.1, pool="")  # and slow tokens, twice
    m.ended("b", "t", False, 0.5, now=0.1, pool="")
    assert m.tokens_slow(0.1)
    assert not m.tokens_slow(10.2)  # the per-token misses have left the window


def test_calls_queued_for_room_expect_a_turn_each_at_the_rate_calls_end() -> None:
    m = monitor(window_s=2.0)
    for i in range(8):
        m.ended(f"c{i}", "t", False, None, now=0.25 * i, pool="")  # 8 ends in 2 s: 4 a second
    assert m.ends_per_s(2.0, "") == 4.0
    assert m.ends_per_s(3.0, "") == 2.0  # the first four have left the window
    m.ended("d", "t", False, None, now=3.0, pool="b")  # another pool's: a rate of its own
    assert (m.ends_per_s(3.0, "b"), m.ends_per_s(3.0, "")) == (0.5, 2.0)
    # three calls queued, ready 0.3, 0.1 and 0 s ago: each waits a quarter second a turn
    assert expected_waits([9.7, 9.9, 10.0], 10.0, 4.0) == pytest.approx([0.55, 0.6, 0.75])
    assert expected_waits([9.5], 10.0, 0.0) == [0.5]  # no rate known: only what it waited


def test_a_call_expected_to_wait_past_its_target_is_a_miss_before_it_has() -> None:
    m = monitor(min_calls=1)
    (wait,) = expected_waits([0.0], now=0.5, ends_per_s=1.0)  # waited 0.5 s, a 1 s turn ahead
    m.overdue("queued", "t", False, waited_s=wait, now=0.5)
    assert m.violation_rate(0.5) == 1.0 and m.update(0.5) == 1
