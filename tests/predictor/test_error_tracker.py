import math
import random

import numpy as np
import pytest

from predictor.distribution import LengthDistribution
from predictor.error_tracker import ErrorTracker
from predictor.errors import InvalidCall

PRED = LengthDistribution.from_quantiles(100, 200, 400)


def test_unknown_tenant_is_not_conservative() -> None:
    stats = ErrorTracker().stats("nobody")
    assert (stats.count, stats.p90_coverage, stats.conservative) == (0, 1.0, False)


def test_accurate_predictions_keep_normal_mode() -> None:
    tracker = ErrorTracker(min_samples=5)
    for n in (90, 100, 110, 150, 180, 100):
        tracker.record("t", PRED, n)
    stats = tracker.stats("t")
    assert stats.p90_coverage == 1.0
    assert stats.mean_abs_log_error == pytest.approx(
        sum(abs(math.log1p(n) - math.log1p(100)) for n in (90, 100, 110, 150, 180, 100)) / 6
    )
    assert not tracker.conservative("t")
    assert tracker.planning_length("t", PRED) == 100
    assert tracker.planning_quantile("t") == 0.5


def test_large_error_switches_to_p90_after_min_samples() -> None:
    tracker = ErrorTracker(min_samples=5, error_threshold=0.9, coverage_floor=0.0)
    for i in range(5):  # never three misses in a row: the window's statistics decide
        tracker.record("t", PRED, 10 if i % 2 else 1000)
        assert tracker.conservative("t") is (i == 4)
    # the p90 widened to what its calls produced: 1000, 10, 1000, 10, 1000
    assert tracker.planning_length("t", PRED) == 1000
    assert tracker.planning_quantile("t") == 0.9
    assert not tracker.conservative("other")


def test_low_coverage_alone_switches_to_conservative() -> None:
    tracker = ErrorTracker(min_samples=4, error_threshold=100.0, coverage_floor=0.75)
    for n in (300, 300, 100, 100):
        tracker.record("t", PRED, n)
    assert tracker.stats("t").p90_coverage == 0.5
    assert tracker.conservative("t")


def test_window_slides_and_running_sums_match_a_recount() -> None:
    tracker = ErrorTracker(window=10, min_samples=10)
    rng = random.Random(3)
    history = []
    for _ in range(500):
        n = rng.randint(0, 1000)
        history.append(n)
        tracker.record("t", PRED, n)
        recent = history[-10:]
        stats = tracker.stats("t")
        expected = sum(abs(math.log1p(x) - math.log1p(100)) for x in recent) / len(recent)
        assert stats.mean_abs_log_error == pytest.approx(expected)
        assert stats.p90_coverage == sum(x <= 200 for x in recent) / len(recent)
    for _ in range(10):
        tracker.record("t", PRED, 100)
    assert not tracker.conservative("t")  # the bad past has slid out


def test_calls_past_their_p90_in_a_row_switch_at_once() -> None:
    tracker = ErrorTracker(min_samples=20, streak=3)
    for n in (150, 900, 900):
        tracker.record("liar", PRED, n)
        assert not tracker.conservative("liar")
    tracker.record("liar", PRED, 900)  # a 1-in-1000 event for a calibrated p90
    assert tracker.conservative("liar")
    assert tracker.planning_length("liar", PRED) == pytest.approx(900)
    tracker.record("liar", PRED, 150)  # covered: the streak is broken, too few calls to judge
    assert not tracker.conservative("liar")


def test_the_call_that_turns_a_tenant_conservative_says_so_once() -> None:
    """So that the calls planned before it, still waiting, are planned again at that moment."""
    tracker = ErrorTracker(min_samples=20, streak=3)
    assert [tracker.overrun("liar", 4096) for _ in range(3)] == [False, False, True]
    assert not tracker.overrun("liar", 4096)  # conservative already
    assert not tracker.record("liar", PRED, 4096, overran_max_tokens=4096)
    assert not tracker.record("liar", PRED, 150)  # back to normal: no turn to report
    assert [tracker.record("liar", PRED, 900) for _ in range(3)] == [False, False, True]


def test_calls_still_running_past_their_p90_switch_before_any_finishes() -> None:
    tracker = ErrorTracker(min_samples=20, streak=3)
    for _ in range(3):
        tracker.overrun("liar", 4096)
    stats = tracker.stats("liar")
    assert stats.conservative and stats.count == 0 and stats.overrunning == 3
    assert tracker.planning_length("liar", PRED) == 4096  # what they may still use
    for n in (3000, 4096, 2000):  # they finish: counted past the p90 once, not twice
        tracker.record("liar", PRED, n, overran_max_tokens=4096)
    stats = tracker.stats("liar")
    assert stats.overrunning == 0 and stats.count == 3 and stats.p90_coverage == 0.0
    assert tracker.planning_length("liar", PRED) == pytest.approx(
        np.quantile([3000, 4096, 2000], 0.9)
    )
    tracker.record("liar", PRED, 150)
    assert not tracker.conservative("liar")  # one covered call ends the streak of three


def test_calls_that_cannot_run_past_their_p90_do_not_break_a_streak() -> None:
    """Any covered call broke the streak: a liar putting a one-token call (max_tokens 1, its
    p90 at its cap) between its long ones kept its head start for good."""
    tracker = ErrorTracker(min_samples=20, streak=3)
    tiny = LengthDistribution.from_quantiles(1, 1, 1)
    for _ in range(3):
        assert not tracker.conservative("liar")
        tracker.record("liar", PRED, 4096, max_tokens=4096)
        for _ in range(4):
            tracker.record("liar", tiny, 1, max_tokens=1)
    assert tracker.conservative("liar")


def test_a_window_whose_tokens_came_mostly_past_their_p90_is_conservative() -> None:
    """Counted by calls, four short answers (ones that could have run long) for each long lie
    kept the coverage at 0.8 and broke every streak; by tokens, 80 % came past the p90."""
    tracker = ErrorTracker(min_samples=20, streak=3)
    for _ in range(4):
        tracker.record("liar", PRED, 2000, max_tokens=4096)
        for _ in range(4):
            tracker.record("liar", PRED, 2, max_tokens=4096)
    stats = tracker.stats("liar")
    assert stats.p90_coverage == 0.8 and stats.excess_share == pytest.approx(4 * 1800 / 8032)
    assert stats.conservative


def test_calibrated_heavy_tailed_lengths_stay_normal() -> None:
    """Log-normal lengths of sigma 1 against their own quantiles: about 17 % of the tokens
    come past the p90, under the 30 % that switches."""
    rng = random.Random(5)
    truth = LengthDistribution.from_quantiles(100, 100 * math.exp(1.2816), 100 * math.exp(2.3263))
    tracker = ErrorTracker()
    for _ in range(2000):
        tracker.record("t", truth, round(100 * rng.lognormvariate(0, 1)), max_tokens=100_000)
    stats = tracker.stats("t")
    assert 0.1 < stats.excess_share < 0.3 and not stats.conservative


def test_a_conservative_tenant_that_runs_short_keeps_its_p90() -> None:
    tracker = ErrorTracker(min_samples=5, coverage_floor=0.0, error_threshold=0.5)
    for _ in range(5):
        tracker.record("t", PRED, 5)  # far under the p50: wrong, yet never past the p90
    assert tracker.conservative("t")
    assert tracker.planning_length("t", PRED) == PRED.p90


def test_tenants_are_bounded() -> None:
    tracker = ErrorTracker(max_tenants=3)
    for i in range(10):
        tracker.record(f"t{i}", PRED, 100)
    assert tracker.stats("t0").count == 0 and tracker.stats("t9").count == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidCall):
        ErrorTracker(window=5, min_samples=6)
    with pytest.raises(InvalidCall):
        ErrorTracker().record("t", PRED, -3)
    with pytest.raises(InvalidCall):
        ErrorTracker(window=5, min_samples=5, streak=6)
