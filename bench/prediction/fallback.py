"""Fitting and calibrating the prompt model's fallback to the prior (`predictor.familiarity`).

`familiarity_of` reads what the fallback needs from a model's training prompts: their dense
features' means and deviations, the hashed buckets they fill, and the prior, the same constant
as the `constant_mean` baseline (mean of the prompts' median lengths, p90 and p99 of all their
samples). `calibrate` picks the midpoint and slope of the trust curve on sources the model never
saw: given, for each source left out of a model's training, its prompts' distances, that model's
answers and the true medians, the grid point with the lowest mean over sources of the MAE
relative to the prior's own MAE there (each source weighs the same, however many prompts it
has). The grid includes "never fall back", so calibration can only choose a fallback that helped
on held-out sources. Invariant: calibration never sees the source it will be judged on
(`bench.prediction.by_source` calibrates each left-out source on the others).

    python -m bench.prediction.by_source --write-fallback  # fits and stores it in the artifacts
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.prediction.errors import NotEnoughData
from bench.prediction.metrics import mae
from bench.prediction.training import Example
from predictor.distribution import LengthDistribution
from predictor.familiarity import Familiarity
from predictor.features import extract

SLOPES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
MIDPOINT_LEVELS = np.linspace(0.0, 1.0, 21)  # midpoints tried: these quantiles of the distances
NEVER_MIDPOINT = 1e6  # no feature distance comes near: the model is trusted everywhere


@dataclass(frozen=True, slots=True)
class HeldOutSource:
    """One source a model never saw, as calibration needs it."""

    familiarity: Familiarity  # fitted on that model's training prompts (its prior included)
    distances: tuple[float, ...]  # of the source's prompts to that training set
    predicted: tuple[LengthDistribution, ...]  # the model's answers without fallback
    medians: tuple[float, ...]  # the true median lengths
    caps: tuple[int, ...]


def prior_of(lengths: Sequence[Sequence[int]]) -> LengthDistribution:
    """The constant prediction: mean of the prompts' medians, p90/p99 of all samples."""
    if not lengths or not all(lengths):
        raise NotEnoughData("need at least one prompt with samples")
    medians = [float(np.median(group)) for group in lengths]
    flat = LengthDistribution.from_samples([float(n) for group in lengths for n in group])
    return LengthDistribution.from_quantiles(float(np.mean(medians)), flat.p90, flat.p99)


def familiarity_of(examples: Sequence[Example]) -> Familiarity:
    """The fallback's statistics of `examples`, trusting the model everywhere until calibrated."""
    feats = [extract(e.text, e.prompt_tokens) for e in examples]
    dense = np.array([f.dense for f in feats])
    scale = dense.std(axis=0)
    scale[scale < 1e-8] = 1.0  # a constant column: any deviation counts in its raw units
    seen = frozenset(i for f in feats for i in f.hashed)
    return Familiarity(
        tuple(float(v) for v in dense.mean(axis=0)),
        tuple(float(v) for v in scale),
        seen,
        NEVER_MIDPOINT,
        1.0,
        prior_of([e.lengths for e in examples]),
    )


def held_out_source(
    familiarity: Familiarity,
    examples: Sequence[Example],
    predicted: Sequence[LengthDistribution],
) -> HeldOutSource:
    distances = tuple(familiarity.distance(extract(e.text, e.prompt_tokens)) for e in examples)
    return HeldOutSource(
        familiarity,
        distances,
        tuple(predicted),
        tuple(float(np.median(e.lengths)) for e in examples),
        tuple(e.max_tokens or 1 << 30 for e in examples),
    )


def calibrate(sources: Sequence[HeldOutSource]) -> tuple[float, float, float]:
    """(midpoint, slope, mean relative MAE) with the lowest mean relative MAE over `sources`."""
    if not sources:
        raise NotEnoughData("calibration needs at least one held-out source")
    pooled = np.concatenate([np.asarray(s.distances) for s in sources])
    midpoints = [float(m) for m in np.unique(np.quantile(pooled, MIDPOINT_LEVELS))]
    best = (NEVER_MIDPOINT, 1.0, _relative_mae(sources, NEVER_MIDPOINT, 1.0))
    for midpoint in midpoints:
        for slope in SLOPES:
            loss = _relative_mae(sources, midpoint, slope)
            if loss < best[2] - 1e-12:
                best = (midpoint, slope, loss)
    return best


def _relative_mae(sources: Sequence[HeldOutSource], midpoint: float, slope: float) -> float:
    ratios = []
    for s in sources:
        fam = dataclasses.replace(s.familiarity, midpoint=midpoint, slope=slope)
        blended = [
            fam.blend(d, fam.weight(x), cap).p50
            for d, x, cap in zip(s.predicted, s.distances, s.caps, strict=True)
        ]
        prior = [min(fam.prior.p50, cap) for cap in s.caps]
        ratios.append(mae(blended, s.medians) / max(mae(prior, s.medians), 1e-9))
    return float(np.mean(ratios))
