"""Online residual correction of a static length model, per key (a tenant's kind of call:
(tenant, name)).

A trained model is wrong in a consistent direction on prompts unlike its training set (a new
tenant, a new kind of task), so each key learns from its finished calls how far off the model is:
it keeps the count `n` of observed calls and a running mean `r` of their log residuals `log1p(true)
- log1p(model p50)` (a plain mean over the first `1 / alpha` calls, exponentially weighted after,
so it follows a drifting workload). The shift applied to the model's answer is `r * n / (n +
prior_calls)`: shrunk toward zero while few calls are seen, since one call's length is mostly noise
(4 samples of one prompt differ by a factor 2 typically). Every quantile moves by the shift in log
space, so the prompt's own ranking and spread stand and only its level is corrected. A key whose
corrected answers have done worse than the model's own is not corrected: each key also keeps the
running mean absolute error, in tokens, of the model's p50 and of the p50 its shift would have
given (weighted as `r` is), and `apply` shifts only while the second is no larger. On some kinds
of call the level moves with the prompts (a few long answers among many short ones), so a mean
residual drags every answer toward the wrong ones. Each tenant's
keys are kept in their own LRU order and dropped past `max_keys_per_tenant` (`OwnedLru`: one
tenant's new names never evict another's). Invariant: a key without observations leaves a
prediction as it was, and a corrected prediction never exceeds the cap.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from predictor.distribution import LengthDistribution
from predictor.errors import InvalidCall
from predictor.owned_lru import OwnedLru

Key = tuple[str, str]  # (tenant, name)


class _Learnt(NamedTuple):
    """What a key has learnt: see the module docstring."""

    calls: int  # calls observed
    residual: float  # their mean log residual
    plain: float  # the model's p50's mean absolute error
    corrected: float  # the shifted p50's


_NOTHING = _Learnt(0, 0.0, 0.0, 0.0)


def _shifted(length: float, shift: float) -> float:
    """A length moved by `shift` in log space (never below 0)."""
    return math.expm1(max(math.log1p(length) + shift, 0.0))


class ResidualCorrection:
    def __init__(
        self, *, prior_calls: float = 10.0, alpha: float = 0.02, max_keys_per_tenant: int = 1024
    ) -> None:
        if prior_calls < 0 or not 0 < alpha <= 1 or max_keys_per_tenant < 1:
            raise InvalidCall("need prior_calls >= 0, 0 < alpha <= 1 and max_keys_per_tenant >= 1")
        self.prior_calls, self.alpha = prior_calls, alpha
        self._keys: OwnedLru[_Learnt] = OwnedLru(max_keys_per_tenant)

    def shift(self, key: Key) -> float:
        """The log-space correction learnt for `key`; 0 before any observation."""
        return self._shift(self._keys.get(key) or _NOTHING)

    def _shift(self, learnt: _Learnt) -> float:
        calls = learnt.calls
        return learnt.residual * calls / (calls + self.prior_calls) if calls else 0.0

    def apply(self, key: Key, predicted: LengthDistribution, cap: int) -> LengthDistribution:
        """`predicted` shifted by the key's correction, unless its corrected answers have erred
        more than the model's own."""
        learnt = self._keys.get(key) or _NOTHING
        shift = self._shift(learnt)
        if shift == 0.0 or learnt.corrected > learnt.plain:
            return predicted
        p50, p90, p99 = (_shifted(q, shift) for q in (predicted.p50, predicted.p90, predicted.p99))
        return LengthDistribution.from_quantiles(p50, p90, p99).capped(cap)

    def learn(self, key: Key, predicted: LengthDistribution, true_len: int) -> None:
        """A call of `key` that the uncorrected model predicted as `predicted` produced
        `true_len` tokens."""
        if true_len < 0:
            raise InvalidCall(f"true_len must be >= 0, got {true_len}")
        learnt = self._keys.get(key) or _NOTHING
        shift = self._shift(learnt)
        shifted = _shifted(predicted.p50, shift) if shift else predicted.p50
        residual = math.log1p(true_len) - math.log1p(predicted.p50)
        weight = max(1.0 / (learnt.calls + 1), self.alpha)
        self._keys.put(
            key,
            _Learnt(
                learnt.calls + 1,
                learnt.residual + weight * (residual - learnt.residual),
                learnt.plain + weight * (abs(true_len - predicted.p50) - learnt.plain),
                learnt.corrected + weight * (abs(true_len - shifted) - learnt.corrected),
            ),
        )
