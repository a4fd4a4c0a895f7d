import dataclasses

import numpy as np
import pytest

from bench.prediction.evaluate import baselines
from bench.prediction.fallback import (
    NEVER_MIDPOINT,
    calibrate,
    familiarity_of,
    held_out_source,
    prior_of,
)
from bench.prediction.labels import LabelRow
from bench.prediction.metrics import mae
from bench.prediction.training import Example
from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from tests.predictor.factories import synthetic_examples

UNLIKE = [
    Example("Implement a B-tree in C++ with deletion and iterators.\n" * 4, 300, (500, 512)),
    Example("Roleplay as a pirate captain telling a long sea story. " * 3, 200, (400, 480)),
]


def test_the_prior_is_the_constant_baseline() -> None:
    rows = [LabelRow(f"a:{i}", 10 + i, (i, 2 * i, 3 * i), 512, "g") for i in range(1, 40)]
    constant = baselines(rows)["constant_mean"](CallFeatures("t", "n", 10, 10_000))
    assert prior_of([r.lengths for r in rows]) == constant


def test_training_prompts_are_nearer_than_unlike_ones() -> None:
    train = synthetic_examples(80, seed=1)
    fam = familiarity_of(train)
    near = held_out_source(fam, synthetic_examples(20, seed=2), [fam.prior] * 20)
    far = held_out_source(fam, UNLIKE, [fam.prior] * len(UNLIKE))
    assert max(near.distances) < min(far.distances)
    assert fam.weight(max(far.distances)) == pytest.approx(1.0)  # uncalibrated: trusts all


def median(e: Example) -> float:
    return float(np.median(e.lengths))


def test_calibration_keeps_a_model_that_is_right_everywhere() -> None:
    test = synthetic_examples(30, seed=4)
    exact = [LengthDistribution.point(median(e)) for e in test]
    held = held_out_source(familiarity_of(synthetic_examples(60, seed=1)), test, exact)
    midpoint, _, loss = calibrate([held])
    assert midpoint == NEVER_MIDPOINT and loss == pytest.approx(0.0)


def test_calibration_falls_back_where_the_model_is_wrong_on_unlike_prompts() -> None:
    near, far = synthetic_examples(30, seed=4), UNLIKE * 10
    # right on prompts like its training set, five times too short on the others
    predicted = [LengthDistribution.point(median(e)) for e in near]
    predicted += [LengthDistribution.point(median(e) / 5) for e in far]
    held = held_out_source(familiarity_of(synthetic_examples(60, seed=1)), near + far, predicted)
    midpoint, slope, loss = calibrate([held])
    prior = [held.familiarity.prior.p50] * len(predicted)
    bare = mae([d.p50 for d in predicted], held.medians) / mae(prior, held.medians)
    assert midpoint < NEVER_MIDPOINT and loss < bare
    fam = dataclasses.replace(held.familiarity, midpoint=midpoint, slope=slope)
    assert fam.weight(held.distances[0]) > 0.5 > fam.weight(held.distances[-1])
