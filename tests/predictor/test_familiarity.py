import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from predictor.errors import ArtifactInvalid
from predictor.familiarity import Familiarity
from predictor.features import DENSE_NAMES, HASH_DIM, extract
from predictor.prompt_model import PromptModel

TRAINING = [f"Answer in one word: what colour is the {t}?" for t in ("sky", "sea", "grass", "sun")]
PRIOR = LengthDistribution.from_quantiles(300, 512, 512)


def fitted(midpoint: float = 1.0, slope: float = 8.0) -> Familiarity:
    feats = [extract(text, 20) for text in TRAINING]
    dense = np.array([f.dense for f in feats])
    scale = np.maximum(dense.std(axis=0), 1.0)
    return Familiarity(
        tuple(dense.mean(axis=0)),
        tuple(scale),
        frozenset(i for f in feats for i in f.hashed),
        midpoint,
        slope,
        PRIOR,
    )


def test_prompts_like_the_training_set_are_nearer_than_unlike_ones() -> None:
    fam = fitted()
    near = fam.distance(extract("Answer in one word: what colour is the sea?", 20))
    far_text = "Implement a thread-safe LRU cache in Rust with generics and write tests.\n" * 3
    far = fam.distance(extract(far_text, 400))
    assert near < 0.5 < far


def test_trust_falls_with_distance_and_is_half_at_the_midpoint() -> None:
    fam = fitted(midpoint=1.0, slope=4.0)
    weights = [fam.weight(d) for d in (0.0, 0.5, 1.0, 2.0, 1e9)]
    assert weights == sorted(weights, reverse=True)
    assert weights[2] == pytest.approx(0.5) and weights[-1] == 0.0


def test_blend_moves_the_p50_to_the_prior_and_only_widens_the_tail() -> None:
    fam = fitted()
    model = LengthDistribution.from_quantiles(20, 60, 100)
    assert fam.blend(model, 1.0, 512) == model
    fallen = fam.blend(model, 0.0, 512)
    assert fallen.p50 == PRIOR.p50 and fallen.p90 == PRIOR.p90
    half = fam.blend(model, 0.5, 512)
    assert half.p50 == pytest.approx((20 + 300) / 2) and half.p90 >= model.p90
    wide = LengthDistribution.from_quantiles(400, 900, 1500)  # wider than the prior: kept
    assert fam.blend(wide, 0.5, 2000).p99 == wide.p99
    assert fam.blend(wide, 0.5, 256).p99 <= 256


def test_the_prompt_model_falls_back_on_unfamiliar_prompts_and_round_trips(
    tmp_path: Path,
) -> None:
    heads = np.array([(0.0, 1.0), (0.5, 1.0), (1.0, 1.0)])
    bare = PromptModel(np.zeros(len(DENSE_NAMES)), np.zeros(HASH_DIM), np.log1p(10), heads, {})
    model = bare.with_fallback(fitted())
    familiar = CallFeatures("t", "n", 20, 512, TRAINING[0])
    strange = CallFeatures("t", "n", 400, 512, "Write a compiler for a Lisp in C. " * 30)
    assert model.predict(familiar).p50 == pytest.approx(bare.predict(familiar).p50, rel=0.05)
    assert model.predict(strange).p50 > 0.9 * PRIOR.p50 > bare.predict(strange).p50
    path = tmp_path / "m.npz"
    model.save(path)
    loaded = PromptModel.load(path)
    assert loaded.fallback == model.fallback
    assert loaded.predict(strange) == model.predict(strange)


def test_a_fallback_that_does_not_fit_the_layout_is_refused(tmp_path: Path) -> None:
    fam = fitted()
    with pytest.raises(ArtifactInvalid):
        dataclasses.replace(fam, dense_scale=(1.0,))
    arrays = fam.arrays()
    with pytest.raises(ArtifactInvalid):
        Familiarity.from_arrays(arrays["fallback_dense"][:, :3], *list(arrays.values())[1:])


def test_an_artifact_with_part_of_a_fallback_is_refused(tmp_path: Path) -> None:
    heads = np.array([(0.0, 1.0), (0.5, 1.0), (1.0, 1.0)])
    model = PromptModel(np.zeros(len(DENSE_NAMES)), np.zeros(HASH_DIM), 1.0, heads, {})
    path = tmp_path / "m.npz"
    model.with_fallback(fitted()).save(path)
    with np.load(path) as data:
        arrays: dict[str, Any] = {k: data[k] for k in data.files if k != "fallback_seen"}
    np.savez(path, **arrays)
    with pytest.raises(ArtifactInvalid):
        PromptModel.load(path)
