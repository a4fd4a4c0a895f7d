import pytest

from predictor.errors import NotEnoughData
from predictor.metrics import coverage, kendall_tau, mae


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
