"""Accuracy measures of length predictions, as the predictor benchmark reports them.

Kendall's tau-b between predicted and true point lengths (rank agreement: what ordering
policies need), mean absolute error of the point, and coverage: the share of individual
sampled lengths at or under the predicted quantile. Invariant: pure functions of their inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from predictor.errors import NotEnoughData


def kendall_tau(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Kendall's tau-b; 0 when either side is constant (no ranking at all)."""
    from scipy.stats import kendalltau

    if len(predicted) != len(actual) or len(predicted) < 2:
        raise NotEnoughData("need two equally long sequences of at least 2 values")
    if len(set(predicted)) < 2 or len(set(actual)) < 2:
        return 0.0
    tau = float(kendalltau(predicted, actual).statistic)
    return 0.0 if math.isnan(tau) else tau


def mae(predicted: Sequence[float], actual: Sequence[float]) -> float:
    if len(predicted) != len(actual) or not predicted:
        raise NotEnoughData("need two equally long, non-empty sequences")
    return float(np.mean(np.abs(np.asarray(predicted) - np.asarray(actual))))


def coverage(quantiles: Sequence[float], samples: Sequence[Sequence[int]]) -> float:
    """Share of all individual samples at or under their prompt's predicted quantile."""
    if len(quantiles) != len(samples) or not samples:
        raise NotEnoughData("need one quantile per prompt's samples")
    hits = sum(sum(1 for s in group if s <= q) for q, group in zip(quantiles, samples, strict=True))
    return hits / sum(len(group) for group in samples)
