"""The prompt predictor: output length from the prompt's own features, trained offline.

A linear model gives the prompt's central log length `mu = bias + w_dense . dense + v *
sum(w_hash[bucket])` (see `predictor.features`); each quantile q in `QUANTILES` is
`expm1(a_q + b_q * mu)`, clipped to `[0, max_tokens]` and made non-decreasing in q. The
`hidden` variant (trained with the prompts' hidden states, engine/hidden.py) adds
`w_hidden . (h - mean)` once the call is prefilled (`refine`); before that it predicts as if
`h` were the mean. With a `Familiarity` (`predictor.familiarity`, stored in the same artifact),
an answer for a prompt unlike the training prompts falls back toward the training lengths' prior
and widens. Weights live in plain Python lists at inference, which for a few hundred
features is faster than numpy's per-call overhead. The artifact is one `.npz` (no pickles)
whose metadata names the feature layout it was trained with. Invariant: a loaded model's
feature layout equals the running code's, or loading fails.

    python -m bench.prediction.training train --labels predictor/artifacts/labels_alpaca_eval.jsonl
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cachetools import LRUCache

from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from predictor.errors import ArtifactInvalid, ArtifactMissing, InvalidCall
from predictor.familiarity import Familiarity
from predictor.features import (
    DENSE_NAMES,
    FEATURE_VERSION,
    HASH_DIM,
    PromptFeatures,
    bounded,
    extract,
)

QUANTILES = (0.5, 0.9, 0.99)
FORMAT_VERSION = "1"
DEFAULT_ARTIFACT = Path(__file__).parent / "artifacts" / "prompt_model.npz"
HIDDEN_ARTIFACT = Path(__file__).parent / "artifacts" / "prompt_hidden_model.npz"
_ARRAYS = ("dense_weights", "hash_weights", "bias", "heads", "hidden_weights", "hidden_mean")
_FALLBACK_ARRAYS = ("fallback_dense", "fallback_seen", "fallback_params")  # optional
# prompts whose reading is kept: the gateway predicts a call as its job arrives, as it is
# planned and as it ends, and reading the prompt is most of a prediction's cost. Kept under the
# part of the prompt that features read, not the whole prompt: whole prompts (up to the
# gateway's max_prompt_chars each) would pin hundreds of MB after their jobs are gone
READINGS_KEPT = 256


@dataclass(frozen=True, slots=True)
class _Reading:
    mu: float  # the prompt's central log1p length
    familiarity: float | None  # the fallback's weight for it (None: no fallback)


class PromptModel:
    def __init__(
        self,
        dense_weights: np.ndarray,
        hash_weights: np.ndarray,
        bias: float,
        heads: np.ndarray,
        meta: dict[str, str],
        hidden_weights: np.ndarray | None = None,
        hidden_mean: np.ndarray | None = None,
        fallback: Familiarity | None = None,
    ) -> None:
        if dense_weights.shape != (len(DENSE_NAMES),) or hash_weights.shape != (HASH_DIM,):
            raise ArtifactInvalid("weights do not match the feature layout")
        self.hidden_weights = np.zeros(0) if hidden_weights is None else hidden_weights
        self.hidden_mean = np.zeros(0) if hidden_mean is None else hidden_mean
        if self.hidden_weights.ndim != 1 or self.hidden_weights.shape != self.hidden_mean.shape:
            raise ArtifactInvalid("hidden weights and mean must be vectors of one size")
        if heads.shape != (len(QUANTILES), 2):
            raise ArtifactInvalid(f"expected {len(QUANTILES)} quantile heads (a, b)")
        self.dense_weights = dense_weights.astype(np.float64)
        self.hash_weights = hash_weights.astype(np.float64)
        self.bias = float(bias)
        self.heads = heads.astype(np.float64)
        self.meta = dict(meta)
        self.fallback = fallback
        self._dense = [float(w) for w in self.dense_weights]
        self._hash = [float(w) for w in self.hash_weights]
        self._heads = [(float(a), float(b)) for a, b in self.heads]
        self._readings: LRUCache[tuple[str, int], _Reading] = LRUCache(READINGS_KEPT)

    def with_fallback(self, fallback: Familiarity | None) -> PromptModel:
        """The same weights answering with `fallback` (None: the model's answer alone)."""
        return PromptModel(
            self.dense_weights,
            self.hash_weights,
            self.bias,
            self.heads,
            self.meta,
            self.hidden_weights,
            self.hidden_mean,
            fallback,
        )

    def point(self, text: str, prompt_tokens: int) -> float:
        """The prompt's central log1p length, mu."""
        return self._read(text, prompt_tokens).mu

    def _read(self, text: str, prompt_tokens: int) -> _Reading:
        key = (bounded(text), prompt_tokens)
        reading = self._readings.get(key)
        if reading is None:
            f = extract(text, prompt_tokens)
            fallback = self.fallback
            weight = None if fallback is None else fallback.weight(fallback.distance(f))
            reading = self._readings[key] = _Reading(self._point(f), weight)
        return reading

    def _point(self, f: PromptFeatures) -> float:
        total = self.bias + sum(w * x for w, x in zip(self._dense, f.dense, strict=True))
        hashed = self._hash
        return total + f.hashed_value * sum(hashed[i] for i in f.hashed)

    def distribution(self, mu: float, max_tokens: int) -> LengthDistribution:
        """The length law for a prompt whose central log1p length is `mu`."""
        cap, ceiling = float(max_tokens), math.log1p(max_tokens)
        levels, low = [], 0.0
        for a, b in self._heads:
            x = a + b * mu  # compared in log space, so a level at the cap is the cap exactly
            low = cap if x >= ceiling else max(math.expm1(x), low)
            levels.append(low)
        return LengthDistribution.from_quantiles(*levels)

    def predict(self, call: CallFeatures) -> LengthDistribution:
        reading = self._read(call.prompt_text, call.prompt_tokens)
        return self._answer(reading, reading.mu, call.max_tokens)

    def _answer(self, reading: _Reading, mu: float, max_tokens: int) -> LengthDistribution:
        predicted = self.distribution(mu, max_tokens)
        if self.fallback is None or reading.familiarity is None:
            return predicted
        return self.fallback.blend(predicted, reading.familiarity, max_tokens)

    @property
    def hidden_size(self) -> int:
        """Length of the hidden vector `refine` takes; 0 for a prompt-only model."""
        return len(self.hidden_weights)

    def refine(self, call: CallFeatures, hidden: Sequence[float]) -> LengthDistribution:
        """The prediction once the call is prefilled and its hidden state is known."""
        if len(hidden) != self.hidden_size:
            raise InvalidCall(f"hidden vector of {len(hidden)}, model takes {self.hidden_size}")
        shift = float(np.dot(self.hidden_weights, np.asarray(hidden) - self.hidden_mean))
        reading = self._read(call.prompt_text, call.prompt_tokens)
        return self._answer(reading, reading.mu + shift, call.max_tokens)

    def observe(self, call: CallFeatures, true_len: int) -> None:
        """A static model: online correction is the history predictor's job
        (`predictor.correction`)."""

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {**self.meta, "format": FORMAT_VERSION, "layout": _layout()}
        arrays: dict[str, Any] = {  # Any: numpy's stubs type **kwargs as its bool flag
            "dense_weights": self.dense_weights,
            "hash_weights": self.hash_weights,
            "bias": np.array(self.bias),
            "heads": self.heads,
            "hidden_weights": self.hidden_weights,
            "hidden_mean": self.hidden_mean,
            "meta": np.array(json.dumps(meta, sort_keys=True)),
        }
        if self.fallback is not None:
            arrays.update(self.fallback.arrays())
        with path.open("wb") as f:
            np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path: Path = DEFAULT_ARTIFACT) -> PromptModel:
        if not path.is_file():
            raise ArtifactMissing(
                f"{path} not found: run `python -m bench.prediction.training train`"
            )
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                arrays = [data[k] for k in _ARRAYS]
                stored = [data[k] for k in _FALLBACK_ARRAYS if k in data]
        except (OSError, KeyError, ValueError) as exc:
            raise ArtifactInvalid(f"{path}: {exc}") from exc
        if meta.get("format") != FORMAT_VERSION or meta.get("layout") != _layout():
            raise ArtifactInvalid(f"{path} was trained with another feature layout: retrain it")
        if len(stored) not in (0, len(_FALLBACK_ARRAYS)):
            raise ArtifactInvalid(f"{path} holds only part of its fallback")
        fallback = Familiarity.from_arrays(*stored) if stored else None
        dense_w, hash_w, bias, heads, hidden_w, hidden_mean = arrays
        return cls(dense_w, hash_w, float(bias), heads, meta, hidden_w, hidden_mean, fallback)


def _layout() -> str:
    return f"v{FEATURE_VERSION}:hash{HASH_DIM}:" + ",".join(DENSE_NAMES)
