import itertools
import math

import numpy as np
import pytest

from predictor.distribution import LengthDistribution
from predictor.errors import InvalidDistribution, QuantileOutOfRange


def test_quantile_passes_through_the_knots_and_interpolates() -> None:
    d = LengthDistribution(mean=150, p50=100, p90=300, p99=600)
    assert d.quantile(0.5) == 100
    assert d.quantile(0.9) == 300
    assert d.quantile(0.99) == 600
    assert d.quantile(0.7) == pytest.approx(200)
    p10 = 100 * 100 / 300  # p90 mirrored in log space
    assert d.quantile(0.1) == pytest.approx(p10)
    assert d.quantile(0.3) == pytest.approx((p10 + 100) / 2)
    assert d.quantile(0.0) == 0


def test_tail_beyond_p99_extends_the_last_slope() -> None:
    d = LengthDistribution.from_quantiles(100, 300, 600)
    slope = (600 - 300) / (0.99 - 0.9)
    assert d.quantile(1.0) == pytest.approx(600 + slope * 0.01)


def test_quantile_is_monotone() -> None:
    d = LengthDistribution.from_quantiles(10, 80, 90)
    levels = np.linspace(0, 1, 101)
    values = [d.quantile(float(q)) for q in levels]
    assert all(a <= b for a, b in itertools.pairwise(values))


def test_from_quantiles_mean_is_the_integral_of_the_quantile_function() -> None:
    d = LengthDistribution.from_quantiles(100, 300, 600)
    grid = np.linspace(0, 1, 200_001)
    numeric = float(np.mean([d.quantile(float(q)) for q in grid[::100]]))
    assert d.mean == pytest.approx(numeric, rel=1e-3)


def test_point_mass() -> None:
    d = LengthDistribution.from_quantiles(42, 42, 42)
    assert d.mean == pytest.approx(0.1 * 42 / 2 + 0.9 * 42)  # the lowest tenth ramps from 0
    assert LengthDistribution.point(42).quantile(0.9) == 42


def test_from_samples_matches_numpy() -> None:
    samples = [3, 10, 10, 20, 50, 400]
    d = LengthDistribution.from_samples(samples)
    assert d.mean == pytest.approx(np.mean(samples))
    assert d.p90 == pytest.approx(np.quantile(samples, 0.9))


def test_scaled_multiplies_every_field() -> None:
    d = LengthDistribution(150, 100, 300, 600).scaled(0.5)
    assert (d.mean, d.p50, d.p90, d.p99) == (75, 50, 150, 300)


def test_capped_clips_quantiles_and_lowers_the_mean() -> None:
    d = LengthDistribution.from_quantiles(100, 300, 600)
    c = d.capped(250)
    assert (c.p50, c.p90, c.p99) == (100, 250, 250)
    assert c.mean < d.mean
    assert c.mean <= 250
    assert d.capped(10_000) is d


@pytest.mark.parametrize(
    "fields",
    [(1, 10, 5, 20), (1, -1, 5, 20), (-1, 1, 2, 3), (1, 1, 2, math.nan), (1, 1, 2, math.inf)],
)
def test_invalid_summaries_are_refused(fields: tuple[float, float, float, float]) -> None:
    with pytest.raises(InvalidDistribution):
        LengthDistribution(*fields)


def test_quantile_level_outside_unit_interval_is_refused() -> None:
    with pytest.raises(QuantileOutOfRange):
        LengthDistribution.point(1).quantile(1.5)
