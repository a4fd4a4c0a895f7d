import numpy as np

from bench.prediction.hidden_layers import PENALTIES, cv_tau, score


def test_ridge_on_a_representation_ranks_by_what_it_carries() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6))
    y = 2.0 * x[:, 2] + rng.normal(scale=0.1, size=300)
    held = np.arange(300) % 5 == 0
    out = score(x, y, np.expm1(y), held)
    assert out["cv_tau"] > 0.8 and out["held_out_tau"] > 0.8
    assert out["penalty"] in PENALTIES


def test_a_representation_that_carries_nothing_ranks_at_chance() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 6))
    y = rng.normal(size=300)
    assert abs(cv_tau(x, y, np.expm1(y), 100.0)) < 0.15
