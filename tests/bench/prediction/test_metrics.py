import numpy as np
import pytest
from scipy import stats

from bench.prediction.errors import NotEnoughData
from bench.prediction.metrics import censored_coverage_floor, coverage, kendall_tau, mae


def test_kendall_tau_extremes_and_ties() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert kendall_tau([5, 5, 5], [1, 2, 3]) == 0.0  # a constant predictor ranks nothing
    # one discordant pair of six: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)


def test_mae_and_coverage() -> None:
    assert mae([1, 2, 3], [2, 2, 5]) == pytest.approx(1.0)
    assert coverage([10, 100], [[5, 10, 11], [50, 200]]) == pytest.approx(3 / 5)


def test_mismatched_inputs_are_refused() -> None:
    with pytest.raises(NotEnoughData):
        kendall_tau([1], [1])
    with pytest.raises(NotEnoughData):
        mae([], [])
    with pytest.raises(NotEnoughData):
        coverage([1], [])


def test_censored_coverage_floor_recovers_a_known_law() -> None:
    # each prompt reaches the cap (512) with its own chance p ~ Beta(0.6, 1.4), 4 samples each
    rng = np.random.default_rng(0)
    chance = rng.beta(0.6, 1.4, size=4000)
    samples = [[512 if rng.random() < p else 100 for _ in range(4)] for p in chance]
    above = stats.beta.sf(0.1, 0.6, 1.4)
    expected = above + 0.9 * (1 - above)
    floor = censored_coverage_floor(samples, [512] * len(samples), 0.9)
    assert floor == pytest.approx(expected, abs=0.01)
    assert floor > 0.95  # a perfect p90 cannot cover as little as 95 % of such samples


def test_censored_coverage_floor_without_capped_samples_is_the_level() -> None:
    assert censored_coverage_floor([[10, 20], [30, 40]], [512, 512], 0.9) == 0.9
