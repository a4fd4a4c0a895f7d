import statistics

import numpy as np
import pytest

from predictor.base import CallFeatures
from predictor.errors import NotEnoughData
from predictor.metrics import coverage, kendall_tau
from predictor.training import Example, train
from tests.predictor.factories import synthetic_examples


def evaluate(model_examples: list[Example], seed: int) -> tuple[float, float, float]:
    model, _ = train(model_examples, seed=seed, damps=(0.3, 1.0), hash_scales=(0.0, 1.0))
    test = synthetic_examples(150, seed=seed + 100)
    dists = [model.predict(CallFeatures("t", "n", e.prompt_tokens, 512, e.text)) for e in test]
    medians = [statistics.median(e.lengths) for e in test]
    tau = kendall_tau([d.p50 for d in dists], medians)
    p90 = coverage([d.p90 for d in dists], [e.lengths for e in test])
    p50 = coverage([d.p50 for d in dists], [e.lengths for e in test])
    return tau, p90, p50


def test_learns_length_from_phrasing_on_unseen_prompts() -> None:
    tau, p90, p50 = evaluate(synthetic_examples(300, seed=1), seed=1)
    assert tau > 0.75
    assert 0.85 <= p90 <= 0.97
    assert 0.4 <= p50 <= 0.62


def test_report_names_the_chosen_settings_and_counts() -> None:
    examples = synthetic_examples(60, seed=2)
    _, report = train(examples, damps=(1.0, 3.0), hash_scales=(1.0,))
    assert set(report.cv_tau) == {"1/1", "3/1"}
    assert report.cv_tau[f"{report.damp:g}/{report.hash_scale:g}"] == max(report.cv_tau.values())
    assert report.num_prompts == 60 and report.num_samples == 240


def test_quantile_heads_are_ordered_for_typical_prompts() -> None:
    model, _ = train(synthetic_examples(120, seed=4))
    for mu in np.linspace(1, 6, 11):
        d = model.distribution(float(mu), max_tokens=10_000)
        assert d.p50 <= d.p90 <= d.p99


def test_too_few_prompts_is_an_error() -> None:
    with pytest.raises(NotEnoughData):
        train(synthetic_examples(5, seed=0), folds=5)


def test_training_is_deterministic() -> None:
    examples = synthetic_examples(80, seed=5)
    a, _ = train(examples, seed=7)
    b, _ = train(examples, seed=7)
    assert np.array_equal(a.hash_weights, b.hash_weights)
    assert a.bias == b.bias
