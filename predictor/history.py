"""The history predictor: a moving average of past output lengths per tenant and node name.

Like VTC's length predictor, a call is expected to produce what its tenant's recent calls to the
same DAG node produced: the mean is an exponential moving average and the quantiles come from a
small sliding window of the latest lengths. A key with too few observations falls back to the
tenant's statistics, then to a prior: never to what other tenants' calls ran (one tenant's calls
would fill that window and set every new tenant's first predictions, long or short at will).
With a `cold` predictor (the prompt model) every call is told by its own text instead, corrected
by what its tenant's calls of that node (of no node: the tenant's bare calls) ran against the
model's predictions (`predictor.correction`): a node's prompts that differ keep their ranking, a
node of alike prompts converges to its own level, and a source unlike the model's training set
is corrected within tens of calls. Each tenant's keys are kept in their own LRU order and its
least recently used are dropped past `max_keys_per_tenant` (`OwnedLru`), so memory stays bounded
whatever names clients invent and one tenant's names never evict another's; past `max_keys`
tenants, the least recently seen one's keys and profile go. Per tenant it also keeps
exponentially weighted mean and variance of log prompt and output lengths (a `LengthProfile`)
for the anomaly guard's z-scores. Invariant: every key's window holds at most `window` lengths,
and a prediction is capped at the call's max_tokens.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from predictor.base import CallFeatures, LengthPredictor
from predictor.correction import ResidualCorrection
from predictor.distribution import LengthDistribution
from predictor.errors import InvalidCall
from predictor.owned_lru import OwnedLru


@dataclass(frozen=True, slots=True)
class LengthProfile:
    """A tenant's typical log lengths: the guard's yardstick for "unusually long"."""

    count: int
    mean_log_output: float
    std_log_output: float
    mean_log_prompt: float
    std_log_prompt: float

    def output_z(self, output_tokens: float, min_std: float = 0.25) -> float:
        """z-score of log1p(output); `min_std` keeps a tenant of uniform lengths from making
        every small deviation extreme (0.25 in log space is a factor of 1.28)."""
        std = max(self.std_log_output, min_std)
        return (math.log1p(output_tokens) - self.mean_log_output) / std

    def prompt_z(self, prompt_tokens: float, min_std: float = 0.25) -> float:
        std = max(self.std_log_prompt, min_std)
        return (math.log1p(prompt_tokens) - self.mean_log_prompt) / std


class _Moments:
    """Exponentially weighted mean and variance (West's update)."""

    __slots__ = ("mean", "var")

    def __init__(self, first: float) -> None:
        self.mean, self.var = first, 0.0

    def add(self, x: float, alpha: float) -> None:
        delta = x - self.mean
        self.mean += alpha * delta
        self.var = (1 - alpha) * (self.var + alpha * delta * delta)


class _KeyStats:
    __slots__ = ("_cached", "count", "ema", "window")

    def __init__(self, window: int) -> None:
        self.count = 0
        self.ema = 0.0
        self.window: deque[int] = deque(maxlen=window)
        self._cached: LengthDistribution | None = None

    def add(self, length: int, alpha: float) -> None:
        self.ema = float(length) if self.count == 0 else self.ema + alpha * (length - self.ema)
        self.count += 1
        self.window.append(length)
        self._cached = None

    def distribution(self) -> LengthDistribution:
        if self._cached is None:
            ordered = sorted(self.window)
            p50, p90, p99 = (_sorted_quantile(ordered, q) for q in (0.5, 0.9, 0.99))
            self._cached = LengthDistribution(self.ema, p50, p90, p99)
        return self._cached


class HistoryPredictor:
    def __init__(
        self,
        prior: LengthDistribution,
        *,
        alpha: float = 0.1,
        window: int = 64,
        min_count: int = 4,
        max_keys: int = 100_000,
        max_keys_per_tenant: int = 1024,
        cold: LengthPredictor | None = None,
        correction: ResidualCorrection | None = None,
    ) -> None:
        if not 0 < alpha <= 1 or window < 1 or min_count < 1 or max_keys < 1:
            raise InvalidCall("need 0 < alpha <= 1 and window, min_count, max_keys >= 1")
        self.prior, self.cold = prior, cold
        self.correction = correction or ResidualCorrection(max_keys_per_tenant=max_keys_per_tenant)
        self.alpha, self.window, self.min_count, self.max_keys = alpha, window, min_count, max_keys
        self._stats: OwnedLru[_KeyStats] = OwnedLru(max_keys_per_tenant, max_owners=max_keys)
        self._profiles: OrderedDict[str, tuple[int, _Moments, _Moments]] = OrderedDict()

    def predict(self, call: CallFeatures) -> LengthDistribution:
        if self.cold is not None:
            return self.correction.apply(own_key(call), self.cold.predict(call), call.max_tokens)
        for key in _fallback_keys(call):
            stats = self._stats.get(key)
            if stats is not None and stats.count >= self.min_count:
                return stats.distribution().capped(call.max_tokens)
        return self.prior.capped(call.max_tokens)

    def observe(self, call: CallFeatures, true_len: int) -> None:
        if true_len < 0:
            raise InvalidCall(f"true_len must be >= 0, got {true_len}")
        if self.cold is not None:  # the residual against the model's own, uncorrected answer
            self.correction.learn(own_key(call), self.cold.predict(call), true_len)
        else:
            for key in _fallback_keys(call):
                self._touch(key).add(true_len, self.alpha)
        self._observe_profile(call.tenant_id, call.prompt_tokens, true_len)

    def profile(self, tenant_id: str) -> LengthProfile | None:
        entry = self._profiles.get(tenant_id)
        if entry is None:
            return None
        count, out, prompt = entry
        return LengthProfile(
            count, out.mean, math.sqrt(out.var), prompt.mean, math.sqrt(prompt.var)
        )

    def _touch(self, key: tuple[str, str]) -> _KeyStats:
        stats = self._stats.get(key)
        if stats is None:
            stats = _KeyStats(self.window)
        self._stats.put(key, stats)
        return stats

    def _observe_profile(self, tenant_id: str, prompt_tokens: int, true_len: int) -> None:
        log_out, log_prompt = math.log1p(true_len), math.log1p(prompt_tokens)
        entry = self._profiles.get(tenant_id)
        if entry is None:
            self._profiles[tenant_id] = (1, _Moments(log_out), _Moments(log_prompt))
            if len(self._profiles) > self.max_keys:
                self._profiles.popitem(last=False)
            return
        count, out, prompt = entry
        out.add(log_out, self.alpha)
        prompt.add(log_prompt, self.alpha)
        self._profiles[tenant_id] = (count + 1, out, prompt)
        self._profiles.move_to_end(tenant_id)


def own_key(call: CallFeatures) -> tuple[str, str]:
    """The call's own key: its tenant's node (its bare calls without one) on its model."""
    return _fallback_keys(call)[0]


def _fallback_keys(call: CallFeatures) -> tuple[tuple[str, str], ...]:
    """(tenant, node), (tenant, ""), each on the call's model (another model answers the same
    prompt at another length): a call without a node name uses its tenant's."""
    scope = f"{call.model}\x00" if call.model else ""
    tenant = (call.tenant_id, scope)
    if call.node_name:
        return ((call.tenant_id, scope + call.node_name), tenant)
    return (tenant,)


def _sorted_quantile(ordered: list[int], q: float) -> float:
    """Linear-interpolation quantile of a sorted list (numpy's default method)."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])
