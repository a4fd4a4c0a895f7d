"""Accuracy measures of length predictions, as the predictor benchmark reports them.

Kendall's tau-b between predicted and true point lengths (rank agreement: what ordering
policies need), mean absolute error of the point, and coverage: the share of individual
sampled lengths at or under the predicted quantile. Labels censored at a cap (the serving
model runs about a third of its AlpacaEval samples to 512 tokens) put a floor under the coverage
even a perfect predictor reaches: a prompt whose chance of reaching the cap exceeds 1 - q has its
true q-quantile at the cap, where it covers every sample. `censored_coverage_floor` estimates
that floor from the labels (a beta-binomial fit of the per-prompt chance of reaching the cap).
Invariant: pure functions of their inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bench.prediction.errors import NotEnoughData


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


def censored_coverage_floor(
    samples: Sequence[Sequence[int]], caps: Sequence[int], q: float
) -> float:
    """Coverage of the true q-quantiles of the prompts' length laws, estimated from labels.

    The chance `p` that a prompt's sample reaches its cap is fitted across prompts as a beta law
    (maximum likelihood on the counts of capped samples); a prompt with `p > 1 - q` is covered
    entirely by its true quantile (the cap), any other one at `q` (lengths below the cap are
    nearly continuous). Returns `P(p > 1 - q) + q * P(p <= 1 - q)`, a share of prompts, which
    is the share of samples `coverage` counts when every prompt has as many samples.
    """
    from scipy import optimize, stats

    if len(samples) != len(caps) or not samples or not all(samples):
        raise NotEnoughData("need one cap per prompt and at least one sample per prompt")
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {q}")
    n = np.array([len(group) for group in samples])
    hits = np.array(
        [sum(s >= cap for s in group) for group, cap in zip(samples, caps, strict=True)]
    )
    if not hits.any():
        return q

    def nll(log_ab: np.ndarray) -> float:
        alpha, beta = np.exp(log_ab)
        return float(-stats.betabinom.logpmf(hits, n, alpha, beta).sum())

    fit = optimize.minimize(nll, np.zeros(2), method="Nelder-Mead")
    if not fit.success:
        raise NotEnoughData(f"the beta-binomial fit did not converge: {fit.message}")
    alpha, beta = np.exp(fit.x)
    above = float(stats.beta.sf(1.0 - q, alpha, beta))
    return above + q * (1.0 - above)
