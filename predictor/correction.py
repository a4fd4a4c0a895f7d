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

from predictor.distribution import LengthDistribution
from predictor.errors import InvalidCall
from predictor.owned_lru import OwnedLru

Key = tuple[str, str]  # (tenant, name)


class ResidualCorrection:
    def __init__(
        self, *, prior_calls: float = 10.0, alpha: float = 0.02, max_keys_per_tenant: int = 1024
    ) -> None:
        if prior_calls < 0 or not 0 < alpha <= 1 or max_keys_per_tenant < 1:
            raise InvalidCall("need prior_calls >= 0, 0 < alpha <= 1 and max_keys_per_tenant >= 1")
        self.prior_calls, self.alpha = prior_calls, alpha
        # (n, mean residual, model's error, corrected error): see the module docstring
        self._keys: OwnedLru[tuple[int, float, float, float]] = OwnedLru(max_keys_per_tenant)

    def shift(self, key: Key) -> float:
        """The log-space correction learnt for `key`; 0 before any observation."""
        count, residual, _, _ = self._keys.get(key) or (0, 0.0, 0.0, 0.0)
        return residual * count / (count + self.prior_calls) if count else 0.0

    def apply(self, key: Key, predicted: LengthDistribution, cap: int) -> LengthDistribution:
        """`predicted` shifted by the key's correction, unless its corrected answers have erred
        more than the model's own."""
        _, _, plain, corrected = self._keys.get(key) or (0, 0.0, 0.0, 0.0)
        shift = self.shift(key)
        if shift == 0.0 or corrected > plain:
            return predicted
        p50, p90, p99 = (
            math.expm1(max(math.log1p(q) + shift, 0.0))
            for q in (predicted.p50, predicted.p90, predicted.p99)
        )
        return LengthDistribution.from_quantiles(p50, p90, p99).capped(cap)

    def learn(self, key: Key, predicted: LengthDistribution, true_len: int) -> None:
        """A call of `key` that the uncorrected model predicted as `predicted` produced
        `true_len` tokens."""
        if true_len < 0:
            raise InvalidCall(f"true_len must be >= 0, got {true_len}")
        residual = math.log1p(true_len) - math.log1p(predicted.p50)
        shift = self.shift(key)
        shifted = (
            math.expm1(max(math.log1p(predicted.p50) + shift, 0.0)) if shift else predicted.p50
        )
        count, mean, plain, corrected = self._keys.get(key) or (0, 0.0, 0.0, 0.0)
        weight = max(1.0 / (count + 1), self.alpha)
        self._keys.put(
            key,
            (
                count + 1,
                mean + weight * (residual - mean),
                plain + weight * (abs(true_len - predicted.p50) - plain),
                corrected + weight * (abs(true_len - shifted) - corrected),
            ),
        )
