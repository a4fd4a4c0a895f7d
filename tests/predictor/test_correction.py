import math
import random

import pytest

from predictor.correction import ResidualCorrection
from predictor.distribution import LengthDistribution
from predictor.errors import InvalidCall

MODEL = LengthDistribution.from_quantiles(100, 300, 450)


def test_a_key_without_observations_leaves_the_prediction_as_it_was() -> None:
    correction = ResidualCorrection()
    assert correction.shift(("t", "k")) == 0.0
    assert correction.apply(("t", "k"), MODEL, 512) is MODEL


def test_the_shift_is_the_mean_residual_shrunk_by_the_calls_seen() -> None:
    correction = ResidualCorrection(prior_calls=10.0, alpha=0.01)
    for true_len in (200, 400):
        correction.learn(("t", "k"), MODEL, true_len)
    residuals = [math.log1p(n) - math.log1p(MODEL.p50) for n in (200, 400)]
    assert correction.shift(("t", "k")) == pytest.approx(sum(residuals) / 2 * 2 / (2 + 10))


def test_a_source_the_model_underrates_is_corrected_within_tens_of_calls() -> None:
    rng = random.Random(5)
    correction = ResidualCorrection()
    for _ in range(60):  # the truth runs about three times the model's p50
        correction.learn(("t", "k"), MODEL, round(3 * MODEL.p50 * math.exp(rng.gauss(0, 0.4))))
    corrected = correction.apply(("t", "k"), MODEL, 10_000)
    assert 2.2 * MODEL.p50 < corrected.p50 < 3.3 * MODEL.p50
    assert corrected.p50 <= corrected.p90 <= corrected.p99  # ranking and spread kept, shifted


def test_corrections_stay_within_their_key_and_the_cap() -> None:
    correction = ResidualCorrection(prior_calls=0.0)
    correction.learn(("t", "long"), MODEL, 2000)
    assert correction.apply(("t", "other"), MODEL, 512) is MODEL
    capped = correction.apply(("t", "long"), MODEL, 512)
    assert capped.p99 <= 512 and capped.mean <= 512
    correction.learn(("t", "short"), MODEL, 0)
    assert correction.apply(("t", "short"), MODEL, 512).p50 == pytest.approx(0.0)


def test_a_tenants_old_keys_are_dropped_past_its_limit_and_no_other_tenants() -> None:
    correction = ResidualCorrection(prior_calls=0.0, max_keys_per_tenant=2)
    correction.learn(("u", "a"), MODEL, 400)
    for name in ("a", "b", "c"):
        correction.learn(("t", name), MODEL, 400)
    assert correction.shift(("t", "a")) == 0.0 and correction.shift(("t", "c")) > 0
    assert correction.shift(("u", "a")) > 0


def test_later_calls_weigh_more_once_past_one_over_alpha() -> None:
    correction = ResidualCorrection(prior_calls=0.0, alpha=0.5)
    for true_len in (10, 10, 10, 1000):
        correction.learn(("t", "k"), MODEL, true_len)
    assert correction.shift(("t", "k")) > 0  # a plain mean would still be below the model's p50


def test_invalid_settings_and_lengths_are_refused() -> None:
    with pytest.raises(InvalidCall):
        ResidualCorrection(alpha=0)
    with pytest.raises(InvalidCall):
        ResidualCorrection().learn("k", MODEL, -1)


def test_a_key_whose_corrected_answers_err_more_than_the_models_is_left_uncorrected() -> None:
    """Nine calls in ten run exactly the model's p50, the tenth ten times longer: the mean log
    residual is up, and shifting by it would miss the nine by more than it gains on the tenth
    (MAE about 108 tokens against the model's 90)."""
    correction = ResidualCorrection()
    for i in range(100):
        correction.learn(("t", "k"), MODEL, 1000 if i % 10 == 9 else 100)
    assert correction.shift(("t", "k")) > 0.1  # what it learnt
    assert correction.apply(("t", "k"), MODEL, 10_000) is MODEL  # and does not use
