"""An output-length distribution summarised by its mean and three quantiles.

The quantile function is piecewise linear through the knots (0, 0), (0.1, p10), (0.5, p50),
(0.9, p90), (0.99, p99) and (1, p100), where p10 = p50^2 / p90 mirrors p90 in log space (length
laws are roughly log-symmetric) and p100 extends the p90-p99 segment's slope to q = 1, so any
quantile can be read and the mean of the piecewise-linear law is its integral. Invariant:
`0 <= p50 <= p90 <= p99` and `mean >= 0`, all finite; every operation keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictor.errors import InvalidDistribution, QuantileOutOfRange

_LEVELS = (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    mean: float
    p50: float
    p90: float
    p99: float

    def __post_init__(self) -> None:
        values = (self.mean, self.p50, self.p90, self.p99)
        if not all(math.isfinite(v) for v in values):
            raise InvalidDistribution(f"non-finite length summary {values}")
        if self.mean < 0 or not 0 <= self.p50 <= self.p90 <= self.p99:
            raise InvalidDistribution(f"need 0 <= p50 <= p90 <= p99 and mean >= 0, got {values}")

    @classmethod
    def from_quantiles(cls, p50: float, p90: float, p99: float) -> LengthDistribution:
        """The distribution whose mean is the integral of the piecewise-linear quantiles."""
        return cls(_integral(_knots(p50, p90, p99)), p50, p90, p99)

    @classmethod
    def point(cls, length: float) -> LengthDistribution:
        return cls(length, length, length, length)

    @classmethod
    def from_samples(cls, samples: Sequence[float]) -> LengthDistribution:
        if not samples:
            raise InvalidDistribution("no samples")
        p50, p90, p99 = np.quantile(np.asarray(samples, dtype=np.float64), [0.5, 0.9, 0.99])
        return cls(float(np.mean(samples)), float(p50), float(p90), float(p99))

    def quantile(self, q: float) -> float:
        if not 0.0 <= q <= 1.0:
            raise QuantileOutOfRange(f"quantile level {q} is outside [0, 1]")
        knots = _knots(self.p50, self.p90, self.p99)
        for i in range(1, len(_LEVELS)):
            if q <= _LEVELS[i]:
                lo_q, hi_q = _LEVELS[i - 1], _LEVELS[i]
                frac = (q - lo_q) / (hi_q - lo_q)
                return knots[i - 1] + frac * (knots[i] - knots[i - 1])
        raise AssertionError("unreachable: q <= 1 matches the last knot")

    def scaled(self, factor: float) -> LengthDistribution:
        if not factor >= 0:
            raise InvalidDistribution(f"scale factor must be >= 0, got {factor}")
        return LengthDistribution(
            self.mean * factor, self.p50 * factor, self.p90 * factor, self.p99 * factor
        )

    def capped(self, limit: float) -> LengthDistribution:
        """The law of min(length, limit): quantiles clipped, mean lowered by the clipped mass."""
        if not limit >= 0:
            raise InvalidDistribution(f"cap must be >= 0, got {limit}")
        knots = _knots(self.p50, self.p90, self.p99)
        if knots[-1] <= limit:
            return self
        lost = _integral(knots) - _integral([min(k, limit) for k in knots])
        p50, p90, p99 = (min(v, limit) for v in (self.p50, self.p90, self.p99))
        return LengthDistribution(min(max(self.mean - lost, 0.0), limit), p50, p90, p99)


def _knots(p50: float, p90: float, p99: float) -> list[float]:
    p10 = p50 * p50 / p90 if p90 > 0 else 0.0
    p100 = p99 + (p99 - p90) * (1.0 - 0.99) / (0.99 - 0.9)
    return [0.0, p10, p50, p90, p99, p100]


def _integral(knots: Sequence[float]) -> float:
    return sum(
        (_LEVELS[i] - _LEVELS[i - 1]) * (knots[i] + knots[i - 1]) / 2
        for i in range(1, len(_LEVELS))
    )
