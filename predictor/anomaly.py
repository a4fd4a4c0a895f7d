"""The anomaly guard (OWASP LLM10, unbounded consumption): score a call, then cap and demote it.

What it reads: the lower-cased prompt, whole up to `VIEW_CHARS` characters (about 700 tokens),
else `WINDOWS` windows of `WINDOW_CHARS` spread evenly from its first character to its last
(the middle one centred), joined by newlines. Every text signal reads that view, so a call costs
the same whatever its length; past `VIEW_CHARS` the windows cover `VIEW_CHARS / length` of the
prompt, and a sentence placed in a gap between them escapes the text signals (not the length
signals, nor the cap). A phrase pattern runs only when the view holds one of its trigger words,
and then only within `ANCHOR_REACH` of its anchors (literals inside every match, found by
substring search), so most prompts pay for a set intersection and nothing else.

Signals, each adding its weight to the call's score (thresholds are `GuardConfig` fields):
- `endless_output`: the prompt asks for output without end ("repeat it forever", "never stop
  writing", "an infinite list", "keep going", "count to a million") - weight 1;
- `length_inflation`: it asks for as much as possible ("as many as you can", "the longest
  possible answer") - weight 0.5;
- `enormous_output`: a sentence with an ask in it ("write", "give", "list"...) asks for more
  than `enormous_tokens` of output ("a 10,000-word essay", "give me 5000 names") - weight 1.
  The default, 8,192 tokens (about 5,800 words), is the whole context of the default model
  (SmolLM2), 4x the server's default max_model_len and 16x a tenant's default max_tokens
  ceiling: no call can deliver it, so the ask is for unbounded output. A few thousand words ("a
  4000-word doc": 5,600 tokens) is an ordinary long-form ask that max_tokens bounds anyway, and
  a document's "300 pages" or "in 2015 Page became CEO" is no ask at all;
- `repetitive_prompt`: the view (at least 400 characters) compresses (zlib) to under
  `repetition_ratio` of its size, or over `repeated_trigram_share` of its word trigrams are
  repeats - weight 1;
- `gibberish`: among at least `gibberish_min_words` words, under `function_word_share` are
  function words of the best-matching language: random-token word salad - weight 1. Every
  language spends a quarter to a half of its running text on a short closed class (articles,
  particles, prepositions, pronouns, auxiliaries: "the of to", "der und zu", "и в не"; for
  Chinese, Japanese and Korean, characters: the commonest hanzi, the hiragana, the particle
  syllables), while a tokenizer's vocabulary is nearly all open-class pieces, so random tokens
  decode to a few percent under every list. The share is per language (the best of 38), never
  over the union, so salad cannot add up stray hits across languages; languages written in
  CJK characters compete only where those make up half the text or more (and words only where
  they do), so a few hanzi in Latin salad do not count. Numbers are not words; words in scripts
  without a list (Thai, Tamil, Georgian...) are not counted, so such text is left unjudged
  rather than flagged, while Latin-script text in a language without a list is judged by the
  lists of its neighbours;
- `output_zscore` / `prompt_zscore`: the predicted p50 or the prompt length lies over
  `zscore_threshold` standard deviations (log scale) above the tenant's history (with at least
  `min_history` calls) - weight 0.5 each;
- `near_prompt_limit`: the prompt fills over `near_limit_fraction` of its tenant's prompt limit
  (a call built to take the most KV its tenant may) - weight 1; a tenant without a limit is
  not judged by it (a prompt near the model's context is what a long agent call looks like,
  and the context bounds its KV);
- `near_cap`: the predicted p90 reaches `near_limit_fraction` of max_tokens - weight 0.5.
A call scoring at least `flag_score` is flagged: it is stopped at the `cap_quantile` of its
prediction (never under `min_cap_tokens`, never over its max_tokens; the gateway reports the
stop as CAPPED with the reasons), its KV is reserved at that cap, and its cost key is
multiplied by `priority_penalty = 1 + score`. Half-weight signals only flag in pairs or with a
strong one. Invariant: an unflagged call keeps its max_tokens, no reservation, and penalty 1;
the same text always gets the same signals.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Collection
from dataclasses import dataclass

from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from predictor.features import requested_tokens
from predictor.history import LengthProfile
from predictor.languages import function_word_share, read

WINDOWS = 9
WINDOW_CHARS = 320
VIEW_CHARS = WINDOWS * WINDOW_CHARS
ANCHOR_REACH = 80  # characters a phrase match may extend on either side of its anchor


class _Phrase:
    """A pattern, the words one of which every match holds, and literals inside every match."""

    __slots__ = ("anchors", "pattern", "triggers")

    def __init__(self, triggers: str, anchors: tuple[str, ...], pattern: str) -> None:
        self.triggers = frozenset(triggers.split())
        self.anchors = anchors
        self.pattern = re.compile(pattern)

    def search(self, view: str, vocabulary: Collection[str]) -> bool:
        if self.triggers.isdisjoint(vocabulary):
            return False
        hits = sorted(at for anchor in self.anchors for at in _occurrences(view, anchor))
        start, end = 0, -1
        for at in hits:  # merge the reaches that overlap, search each merged span once
            if at - ANCHOR_REACH > end:
                if end >= 0 and self.pattern.search(view, start, end):
                    return True
                start = max(0, at - ANCHOR_REACH)
            end = at + ANCHOR_REACH
        return end >= 0 and self.pattern.search(view, start, end) is not None


def _occurrences(text: str, literal: str) -> list[int]:
    found, at = [], text.find(literal)
    while at >= 0:
        found.append(at)
        at = text.find(literal, at + 1)
    return found


_OUTPUT_VERBS = (
    r"(repeat|repeating|write|writing|say|saying|print|printing|type|typing|continue|generate|"
    r"generating|go on|list|listing|count|counting|talk|talking|output|produce|respond|keep \w+)"
)
_ENDLESS = (
    _Phrase(
        "forever infinitely infinitum endlessly indefinitely eternally nonstop non without until",
        ("forever", "infinit", "endless", "indefinitely", "eternally", "non", "without", "until"),
        r"\b" + _OUTPUT_VERBS + r"\b[^.!?\n]{0,40}?\b(forever|infinitely|endlessly|indefinitely|"
        r"eternally|ad infinitum|non-?stop|without (stopping|end|ever stopping)|until the end of "
        r"time)\b",
    ),
    _Phrase(
        "infinite infinitely endless ending unending unlimited",
        ("infinit", "endless", "ending", "unlimited"),
        r"\b(infinite|endless|never-ending|unending|unlimited|infinitely long) (list|story|poem|"
        r"text|essay|response|answer|sequence|loop|stream|number of|amount of|output|conversation)",
    ),
    _Phrase(
        "stop stopping",
        ("stop",),
        r"\b(never|don'?t|do not|without) stop(ping)? (writing|generating|talking|typing|"
        r"repeating|counting|listing|responding|producing|outputting)",
    ),
    _Phrase(
        "keep",
        ("keep",),
        r"(^|[.!?\n,;:]\s*|\b(and|please|then|just)\s+)keep (on )?(going|writing|repeating|"
        r"generating|typing|printing|counting|talking)\b(?! wrong)",
    ),
    _Phrase(
        "count counting",
        ("count",),
        # "a million", and as well "10 million", "2.5 billion", "five million"
        r"\bcount(ing)? (from \S+ )?(up )?to (a |[\w.,]+ )?(million|billion|trillion|infinity|"
        r"\d{1,3}(,\d{3}){2,}|\d{7,})",
    ),
)
_INFLATION = _Phrase(
    "possible can longest maximum max",
    ("as possible", "as you can", "longest", "maximum", "max"),
    r"\bas (long|lengthy|detailed|verbose|many \w+) as (possible|you can)\b"
    r"|\b(longest|maximum|max) (possible )?(length|answer|response|output|essay|story|list)\b",
)
_ASK = re.compile(
    r"\b(write|give|list|generate|produce|create|make|compose|draft|print|say|repeat|type|"
    r"output|tell|name|provide|need|want|brainstorm|suggest|enumerate|come up with)\b"
)
_SENTENCE_END = re.compile(r"[.!?\n]+")
# runs of blanks between words (tabs, doubled or no-break spaces), read as the one space the
# phrases spell: else "never  stop  writing" would pass every phrase untouched
_BLANKS = re.compile(r"[^\S\n]+")


def guard_view(text: str) -> str:
    """The bounded, lower-cased part of the prompt the guard reads (see the module docstring)."""
    if len(text) <= VIEW_CHARS:
        return text.lower()
    stride = (len(text) - WINDOW_CHARS) / (WINDOWS - 1)
    starts = [round(i * stride) for i in range(WINDOWS)]
    return "\n".join(text[s : s + WINDOW_CHARS] for s in starts).lower()


@dataclass(frozen=True, slots=True)
class GuardConfig:
    flag_score: float = 1.0
    cap_quantile: float = 0.99
    min_cap_tokens: int = 64
    enormous_tokens: float = 8192.0  # the default model's whole context (see the docstring)
    repetition_ratio: float = 0.12  # zlib size / raw size over at least 400 characters
    repeated_trigram_share: float = 0.5  # over at least 30 words
    gibberish_min_words: int = 12
    function_word_share: float = 0.06
    zscore_threshold: float = 3.0
    min_history: int = 20
    near_limit_fraction: float = 0.9
    # the prompt limit of a call assessed without one of its own; None skips that signal
    max_prompt_tokens: int | None = None


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
        prompt_limit: int | None = None,
    ) -> Assessment:
        """`prompt_limit`: the prompt tokens the call's tenant may send (its quota's), else the
        config's `max_prompt_tokens`."""
        limit = prompt_limit if prompt_limit is not None else self.config.max_prompt_tokens
        signals = {**self.prompt_signals(call.prompt_text)}
        signals.update(self._length_signals(call, prediction, tenant_history, limit))
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
        view = guard_view(text)
        reading = read(view)
        words, vocabulary = reading.words, reading.vocabulary.keys()
        spaced = _BLANKS.sub(" ", view)
        if any(phrase.search(spaced, vocabulary) for phrase in _ENDLESS):
            signals["endless_output"] = 1.0
        if _INFLATION.search(spaced, vocabulary):
            signals["length_inflation"] = 0.5
        if requested_tokens(words) > cfg.enormous_tokens and self._asks_enormous(spaced):
            signals["enormous_output"] = 1.0
        if self._repetitive(view, words):
            signals["repetitive_prompt"] = 1.0
        share, units = function_word_share(reading)
        if units >= cfg.gibberish_min_words and share < cfg.function_word_share:
            signals["gibberish"] = 1.0
        return signals

    def _asks_enormous(self, view: str) -> bool:
        """Whether a sentence holding an enormous count also holds an ask ("write", "give"...)."""
        return any(
            requested_tokens(read(sentence).words) > self.config.enormous_tokens
            and _ASK.search(sentence) is not None
            for sentence in _SENTENCE_END.split(view)
        )

    def _repetitive(self, view: str, words: list[str]) -> bool:
        raw = view.encode()
        if len(raw) >= 400 and len(zlib.compress(raw, 1)) < self.config.repetition_ratio * len(raw):
            return True
        if len(words) < 30:
            return False
        distinct = len(set(zip(words, words[1:], words[2:], strict=False)))
        return 1.0 - distinct / (len(words) - 2) > self.config.repeated_trigram_share

    def _length_signals(
        self,
        call: CallFeatures,
        prediction: LengthDistribution,
        history: LengthProfile | None,
        limit: int | None,
    ) -> dict[str, float]:
        cfg = self.config
        signals: dict[str, float] = {}
        if history is not None and history.count >= cfg.min_history:
            if history.output_z(prediction.p50) > cfg.zscore_threshold:
                signals["output_zscore"] = 0.5
            if history.prompt_z(call.prompt_tokens) > cfg.zscore_threshold:
                signals["prompt_zscore"] = 0.5
        if limit is not None and call.prompt_tokens >= cfg.near_limit_fraction * limit:
            signals["near_prompt_limit"] = 1.0
        if prediction.p90 >= cfg.near_limit_fraction * call.max_tokens:
            signals["near_cap"] = 0.5
        return signals
