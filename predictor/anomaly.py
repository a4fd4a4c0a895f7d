"""The anomaly guard (OWASP LLM10, unbounded consumption): score a call, then cap and demote it.

Signals, each adding its weight to the call's score (thresholds are `GuardConfig` fields):
- `endless_output`: the prompt asks for output without end ("repeat it forever", "never stop
  writing", "an infinite list", "keep going", "count to a million") - weight 1;
- `length_inflation`: it asks for as much as possible ("as many as you can", "the longest
  possible answer") - weight 0.5;
- `enormous_output`: it asks explicitly for more than `enormous_tokens` of output ("a
  10,000-word essay", "5000 names") - weight 1;
- `repetitive_prompt`: its first `REPETITION_CHARS` characters compress (zlib) to under
  `repetition_ratio` of their size, or over `repeated_trigram_share` of its word trigrams are
  repeats - weight 1;
- `gibberish`: among at least `gibberish_min_words` words, under `function_word_share` are
  English function words ("the", "of", "to"...): random-token word salad - weight 1;
- `output_zscore` / `prompt_zscore`: the predicted p50 or the prompt length lies over
  `zscore_threshold` standard deviations (log scale) above the tenant's history (with at least
  `min_history` calls) - weight 0.5 each;
- `near_prompt_limit`: the prompt fills over `near_limit_fraction` of `max_prompt_tokens` (a
  call built to take the most KV the server allows) - weight 1;
- `near_cap`: the predicted p90 reaches `near_limit_fraction` of max_tokens - weight 0.5.
A call scoring at least `flag_score` is flagged: it is stopped at the `cap_quantile` of its
prediction (never under `min_cap_tokens`, never over its max_tokens; the gateway reports the
stop as CAPPED with the reasons), its KV is reserved at that cap, and its cost key is
multiplied by `priority_penalty = 1 + score`. Half-weight signals only flag in pairs or with a
strong one. Invariant: an unflagged call keeps its max_tokens, no reservation, and penalty 1.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from predictor.features import requested_tokens, view, words_of
from predictor.history import LengthProfile

REPETITION_CHARS = 4000
_OUTPUT_VERBS = (
    r"(repeat|repeating|write|writing|say|saying|print|printing|type|typing|continue|generate|"
    r"generating|go on|list|listing|count|counting|talk|talking|output|produce|respond|keep \w+)"
)
_ENDLESS = re.compile(
    r"\b" + _OUTPUT_VERBS + r"\b[^.!?\n]{0,40}?\b(forever|infinitely|endlessly|indefinitely|"
    r"eternally|ad infinitum|non-?stop|without (stopping|end|ever stopping)|until the end of time)"
    r"|\b(infinite|endless|never-ending|unending|unlimited|infinitely long) (list|story|poem|text|"
    r"essay|response|answer|sequence|loop|stream|number of|amount of|output|conversation)"
    r"|\b(never|don'?t|do not|without) stop(ping)? (writing|generating|talking|typing|repeating|"
    r"counting|listing|responding|producing|outputting)"
    r"|(^|[.!?\n,;:]\s*|\b(and|please|then|just)\s+)keep (on )?(going|writing|repeating|"
    r"generating|typing|printing|counting|talking)\b(?! wrong)"
    r"|\bcount(ing)? (from \S+ )?(up )?to (a |one )?(million|billion|trillion|infinity|"
    r"\d{1,3}(,\d{3}){2,}|\d{7,})"
)
_INFLATION = re.compile(
    r"\bas (long|lengthy|detailed|verbose|many \w+) as (possible|you can)\b"
    r"|\b(longest|maximum|max) (possible )?(length|answer|response|output|essay|story|list)\b"
)
_FUNCTION_WORDS_TEXT = (
    "the of and to a in is it you that he was for on are with as i his they be at one have "
    "this from or had by not but what some we can out other were all there when up use your "
    "how said an each she which do their if will way about many then them would so these her "
    "see him has more could go come my than who its did get may does me should any our "
    "into also been just am very"
)
_FUNCTION_WORDS = frozenset(_FUNCTION_WORDS_TEXT.split())


@dataclass(frozen=True, slots=True)
class GuardConfig:
    flag_score: float = 1.0
    cap_quantile: float = 0.99
    min_cap_tokens: int = 64
    enormous_tokens: float = 3000.0
    repetition_ratio: float = 0.12  # zlib size / raw size over at least 400 characters
    repeated_trigram_share: float = 0.5  # over at least 30 words
    gibberish_min_words: int = 12
    function_word_share: float = 0.06
    zscore_threshold: float = 3.0
    min_history: int = 20
    near_limit_fraction: float = 0.9
    max_prompt_tokens: int | None = None  # the server's prompt limit; None skips that signal


@dataclass(frozen=True, slots=True)
class Assessment:
    score: float
    reasons: tuple[str, ...]
    cap_tokens: int  # the max_tokens to enforce on the call
    priority_penalty: float  # multiplies the call's cost key in fair ordering; 1 = none
    reserve_at_cap: bool  # admission reserves KV for prompt + cap_tokens

    @property
    def flagged(self) -> bool:
        return self.reserve_at_cap


class AnomalyGuard:
    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = config or GuardConfig()

    def assess(
        self,
        call: CallFeatures,
        prediction: LengthDistribution,
        tenant_history: LengthProfile | None,
    ) -> Assessment:
        signals = {**self.prompt_signals(call.prompt_text)}
        signals.update(self._length_signals(call, prediction, tenant_history))
        score = sum(signals.values())
        reasons = tuple(sorted(signals))
        if score < self.config.flag_score:
            return Assessment(score, reasons, call.max_tokens, 1.0, False)
        tail = math.ceil(prediction.quantile(self.config.cap_quantile))
        cap = min(call.max_tokens, max(self.config.min_cap_tokens, tail))
        return Assessment(score, reasons, cap, 1.0 + score, True)

    def prompt_signals(self, text: str) -> dict[str, float]:
        """Signals read from the prompt's text alone, by name, with their weights."""
        cfg = self.config
        signals: dict[str, float] = {}
        lowered = view(text)
        words = words_of(text)
        if _ENDLESS.search(lowered):
            signals["endless_output"] = 1.0
        if _INFLATION.search(lowered):
            signals["length_inflation"] = 0.5
        if requested_tokens(words) > cfg.enormous_tokens:
            signals["enormous_output"] = 1.0
        if self._repetitive(text, words):
            signals["repetitive_prompt"] = 1.0
        if len(words) >= cfg.gibberish_min_words:
            share = sum(1 for w in words if w in _FUNCTION_WORDS) / len(words)
            if share < cfg.function_word_share:
                signals["gibberish"] = 1.0
        return signals

    def _repetitive(self, text: str, words: list[str]) -> bool:
        head = text[:REPETITION_CHARS].encode()
        if len(head) >= 400 and len(zlib.compress(head)) < self.config.repetition_ratio * len(head):
            return True
        if len(words) < 30:
            return False
        trigrams = list(zip(words, words[1:], words[2:], strict=False))
        repeats = 1.0 - len(set(trigrams)) / len(trigrams)
        return repeats > self.config.repeated_trigram_share

    def _length_signals(
        self, call: CallFeatures, prediction: LengthDistribution, history: LengthProfile | None
    ) -> dict[str, float]:
        cfg = self.config
        signals: dict[str, float] = {}
        if history is not None and history.count >= cfg.min_history:
            if history.output_z(prediction.p50) > cfg.zscore_threshold:
                signals["output_zscore"] = 0.5
            if history.prompt_z(call.prompt_tokens) > cfg.zscore_threshold:
                signals["prompt_zscore"] = 0.5
        limit = cfg.max_prompt_tokens
        if limit is not None and call.prompt_tokens >= cfg.near_limit_fraction * limit:
            signals["near_prompt_limit"] = 1.0
        if prediction.p90 >= cfg.near_limit_fraction * call.max_tokens:
            signals["near_cap"] = 0.5
        return signals
