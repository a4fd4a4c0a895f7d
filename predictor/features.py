"""Cheap features of a call's prompt for the output-length model.

Everything is read from the words of a bounded view of the text (its first `HEAD_CHARS` and
last `TAIL_CHARS` characters, lower-cased), so the cost per call does not grow with the prompt:

- dense: log prompt tokens and words, line count, a trailing question mark, task-phrasing cues
  (asks for a list, detail, brevity, one word, long-form writing, code, a translation...; each
  cue is a set of words and word pairs) and the log of an explicit size request ("in 300
  words", "10 ideas") converted to rough output tokens;
- hashed: word unigrams and bigrams hashed into `HASH_DIM` buckets (CRC-32 of each word, pairs
  combined arithmetically), each present bucket worth `1/sqrt(n)` so a long prompt does not
  outweigh a short one.

Invariant: the same text and token count always give the same features (CRC-32, not Python's
salted `hash`), and every hashed index lies in `[0, HASH_DIM)`.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from dataclasses import dataclass
from operator import itemgetter

FEATURE_VERSION = "1"  # bump on any change to what features mean; artifacts record it
HEAD_CHARS = 1200
TAIL_CHARS = 400
HASH_DIM = 1 << 12

_WORD = re.compile(r"\d{1,3}(?:,\d{3})+|[a-z0-9+#']+")  # "10,000" is one word
_CUE_PHRASES: dict[str, str] = {
    "list": "list lists enumerate bullet some several ideas examples suggest suggestions "
    "brainstorm top|give me|come up|a few",
    "detail": "detail detailed elaborate comprehensive thorough thoroughly|in depth|step by",
    "explain": "explain describe discuss why|how do|how does|how can|how to|how would",
    "brief": "brief briefly short concise concisely summary summarize summarise tldr|"
    "in a|a sentence|one sentence",
    "one_word": "|one word|single word|yes or|true or|only the|just the|answer only",
    "choose": "classify categorize categorise choose select identify rate|which one|which of",
    "longform": "essay story article blog poem song lyrics letter speech script novel "
    "chapter email",
    "code": "code program function python javascript java c++ sql regex implement bash script",
    "transform": "translate rewrite paraphrase correct fix edit convert rephrase",
    "math": "calculate compute solve equation|how many|how much|sum of",
    "compare": "compare comparison difference differences versus vs|pros and",
    "plan": "plan itinerary schedule recipe guide tutorial outline steps strategy",
    "name": "title slogan tagline headline|name a|give me|a name",
    "roleplay": "pretend roleplay|act as|imagine you|you are",
}
_PAIR_MIX = 0x9E3779B1


def _crc(word: str) -> int:
    return zlib.crc32(word.encode())


def _pair(first: int, second: int) -> int:
    return first * _PAIR_MIX + second


_CUES: tuple[tuple[str, frozenset[str], frozenset[int]], ...] = tuple(
    (
        name,
        frozenset(spec.split("|")[0].split()),
        frozenset(_pair(*(_crc(w) for w in pair.split())) for pair in spec.split("|")[1:]),
    )
    for name, spec in _CUE_PHRASES.items()
)
_FACTOID_START = frozenset({"what", "who", "when", "where", "which"})
_YES_NO_START = frozenset(
    {"is", "are", "can", "could", "does", "do", "did", "should", "would", "will", "has", "have"}
)
_NUMBER_WORDS = {
    "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "twelve": 12, "fifteen": 15, "twenty": 20, "fifty": 50, "hundred": 100,
    "thousand": 1000, "million": 1_000_000,
}  # fmt: skip
_MULTIPLIERS = frozenset({"hundred", "thousand", "million"})
_SIZE_ADJECTIVES_TEXT = (
    "short long more different new creative unique good great best main key simple detailed "
    "other funny interesting possible original random baby english full complete brief "
    "additional important distinct separate single double"
)
_SIZE_ADJECTIVES = frozenset(_SIZE_ADJECTIVES_TEXT.split())
SIZE_UNITS = {  # rough tokens of output per unit asked for
    "word": 1.4, "sentence": 25.0, "line": 12.0, "paragraph": 110.0, "page": 600.0,
    "item": 20.0, "idea": 25.0, "example": 30.0, "tip": 30.0, "way": 30.0, "step": 30.0,
    "point": 25.0, "reason": 30.0, "question": 20.0, "name": 6.0, "time": 2.0, "token": 1.0,
    "character": 0.3, "verse": 40.0, "stanza": 40.0, "chapter": 2000.0, "fact": 25.0,
}  # fmt: skip

DENSE_NAMES: tuple[str, ...] = (
    "log_prompt_tokens",
    "log_words",
    "log_lines",
    "question_mark",
    "log_size_request",
    "starts_factoid",
    "starts_yes_no",
    *(f"cue_{name}" for name, _, _ in _CUES),
)


@dataclass(frozen=True, slots=True)
class PromptFeatures:
    dense: tuple[float, ...]  # aligned with DENSE_NAMES
    hashed: tuple[int, ...]  # distinct bucket indices of the present n-grams
    hashed_value: float  # the weight of each present bucket: 1/sqrt(len(hashed))


def bounded(text: str) -> str:
    """The part of the prompt that features read, as written: two texts alike in it have the
    same features."""
    if len(text) > HEAD_CHARS + TAIL_CHARS:
        return text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]
    return text


def view(text: str) -> str:
    """The bounded, lower-cased part of the prompt that features read."""
    return bounded(text).lower()


def words_of(text: str) -> list[str]:
    return _WORD.findall(view(text))


def extract(text: str, prompt_tokens: int) -> PromptFeatures:
    lowered = view(text)
    words = _WORD.findall(lowered)
    word_set = frozenset(words)
    word_hashes = [_crc(w) for w in words]
    pairs = {_pair(a, b) for a, b in itertools.pairwise(word_hashes)}
    first = words[0] if words else ""
    dense = (
        math.log1p(prompt_tokens),
        math.log1p(len(words)),
        math.log1p(lowered.count("\n")),
        1.0 if lowered.rstrip().endswith("?") else 0.0,
        math.log1p(requested_tokens(words)),
        1.0 if first in _FACTOID_START else 0.0,
        1.0 if first in _YES_NO_START else 0.0,
        *(
            0.0 if word_set.isdisjoint(cue_words) and pairs.isdisjoint(cue_pairs) else 1.0
            for _, cue_words, cue_pairs in _CUES
        ),
    )
    mask = HASH_DIM - 1
    buckets = {h & mask for h in word_hashes}
    buckets.update(p & mask for p in pairs)
    hashed = tuple(sorted(buckets))
    return PromptFeatures(dense, hashed, 1.0 / math.sqrt(len(hashed)) if hashed else 0.0)


def requested_tokens(words: list[str]) -> float:
    """Output tokens the words explicitly ask for ("500-word essay" -> 700); 0 if none.

    A count is a number or number word followed by a unit, with at most one common adjective
    between ("10 short ideas", "5000 baby names"); "five thousand words" multiplies.
    """
    best = 0.0
    for i in _count_candidates(words):
        count = _count(words[i])
        if count is None:
            continue
        j = i + 1
        if j < len(words) and words[j] in _MULTIPLIERS:
            count, j = count * _NUMBER_WORDS[words[j]], j + 1
        if j < len(words) and words[j] in _SIZE_ADJECTIVES:
            j += 1
        if j < len(words):
            unit = words[j][:-1] if words[j].endswith("s") else words[j]
            best = max(best, count * SIZE_UNITS.get(unit, 0.0))
    return best


def _count_candidates(words: list[str]) -> list[int]:
    """Indices of the (non-empty) words that may be counts: starting with a digit, or number
    words. C-level scans where possible: this runs on every call, over every word."""
    found = list(itertools.compress(itertools.count(), map(str.isdigit, map(itemgetter(0), words))))
    for number in _NUMBER_WORDS.keys() & set(words):
        at = -1
        for _ in range(words.count(number)):
            at = words.index(number, at + 1)
            found.append(at)
    return found


def _count(word: str) -> float | None:
    digits = word.replace(",", "")
    if digits.isascii() and digits.isdigit() and len(digits) <= 9:  # not "²"
        return float(digits)
    found = _NUMBER_WORDS.get(word)
    return float(found) if found is not None else None
