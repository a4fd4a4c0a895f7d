"""How unlike its training prompts a prompt is, and the fallback to the prior that follows.

A model trained on one source of prompts learns that source's lengths as much as the serving
model's behaviour, so on a prompt unlike its training set its confident answer can be worse than
knowing nothing. The distance is read from the features the prompt model already extracted: the
root mean square of the dense features' z-scores against the training prompts (each clipped at
`Z_CLIP`, so one rare cue cannot dominate), plus the share of the prompt's hashed n-gram buckets
that no training prompt filled (vocabulary the weights never saw). The model's answer is trusted
with weight `w = 1 / (1 + exp(slope * (distance - midpoint)))`: the p50 moves toward the prior's
(the training lengths' constant) as `w * model + (1 - w) * prior`, and the p90 and p99 only widen
toward the prior's. The midpoint and slope are calibrated offline on sources held out of training
(`bench/prediction/fallback.py`). Invariant: at weight 1 the prediction is the model's, at weight
0 the prior's p50, and no quantile exceeds the cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictor.distribution import LengthDistribution
from predictor.errors import ArtifactInvalid
from predictor.features import DENSE_NAMES, HASH_DIM, PromptFeatures

Z_CLIP = 6.0


@dataclass(frozen=True, slots=True)
class Familiarity:
    dense_mean: tuple[float, ...]  # aligned with DENSE_NAMES: the training prompts' features
    dense_scale: tuple[float, ...]  # their standard deviations (1 for constant columns)
    seen: frozenset[int]  # hashed buckets some training prompt filled
    midpoint: float  # distance at which model and prior weigh the same
    slope: float  # how sharply trust falls past the midpoint (0: weight 1/2 everywhere)
    prior: LengthDistribution  # the training lengths' constant prediction

    def __post_init__(self) -> None:
        k = len(DENSE_NAMES)
        if len(self.dense_mean) != k or len(self.dense_scale) != k:
            raise ArtifactInvalid("familiarity statistics do not match the feature layout")
        if min(self.dense_scale) <= 0 or not math.isfinite(self.midpoint) or self.slope < 0:
            raise ArtifactInvalid("need positive scales, a finite midpoint and slope >= 0")

    def distance(self, features: PromptFeatures) -> float:
        squares = 0.0
        for x, mean, scale in zip(features.dense, self.dense_mean, self.dense_scale, strict=True):
            z = min(abs(x - mean) / scale, Z_CLIP)
            squares += z * z
        hashed = features.hashed
        unseen = sum(1 for i in hashed if i not in self.seen) / len(hashed) if hashed else 0.0
        return math.sqrt(squares / len(self.dense_mean)) + unseen

    def weight(self, distance: float) -> float:
        """Trust in the model's answer, in (0, 1); 1/2 at the midpoint."""
        x = self.slope * (distance - self.midpoint)
        return 0.0 if x > 700 else 1.0 / (1.0 + math.exp(x))  # exp overflows past ~709

    def blend(self, predicted: LengthDistribution, weight: float, cap: int) -> LengthDistribution:
        prior = self.prior
        p50 = weight * predicted.p50 + (1 - weight) * prior.p50
        p90 = max(predicted.p90, weight * predicted.p90 + (1 - weight) * prior.p90, p50)
        p99 = max(predicted.p99, weight * predicted.p99 + (1 - weight) * prior.p99, p90)
        return LengthDistribution.from_quantiles(p50, p90, p99).capped(cap)

    def arrays(self) -> dict[str, np.ndarray]:
        """The statistics as the prompt model's artifact stores them."""
        seen = np.zeros(HASH_DIM, dtype=np.uint8)
        seen[sorted(self.seen)] = 1
        params = [self.midpoint, self.slope, self.prior.p50, self.prior.p90, self.prior.p99]
        return {
            "fallback_dense": np.array([self.dense_mean, self.dense_scale]),
            "fallback_seen": seen,
            "fallback_params": np.array(params),
        }

    @classmethod
    def from_arrays(cls, dense: np.ndarray, seen: np.ndarray, params: np.ndarray) -> Familiarity:
        if dense.shape != (2, len(DENSE_NAMES)) or seen.shape != (HASH_DIM,) or len(params) != 5:
            raise ArtifactInvalid("fallback arrays do not match the feature layout")
        midpoint, slope, p50, p90, p99 = (float(v) for v in params)
        return cls(
            _floats(dense[0]),
            _floats(dense[1]),
            frozenset(int(i) for i in np.flatnonzero(seen)),
            midpoint,
            slope,
            LengthDistribution.from_quantiles(p50, p90, p99),
        )


def _floats(values: Sequence[float] | np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in values)
