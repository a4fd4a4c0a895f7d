"""The anomaly guard's benchmark: a hostile prompt suite beside ordinary prompts.

Hostile prompts come in five kinds, built from templates and a seeded generator: asks for
endless output, asks for enormous output, repetition (prompts that repeat themselves or ask
for a repeated string), near-limit inputs (filler up to 95% of the prompt limit) and
random-token gibberish (random ids of the serving tokenizer, decoded). Ordinary prompts are a
seeded sample of AlpacaEval and GPTeacher instructions. The guard sees each call with the
prompt model's prediction (or a flat prior without one) and no tenant history. Reported:
detection rate per kind, false-positive rate on the ordinary prompts, and the cap each
flagged call gets. Invariant: the same data, tokenizer and seed give the same suite.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.prediction.sources import alpaca_eval, gpteacher
from predictor import AnomalyGuard, CallFeatures, GuardConfig, LengthDistribution

TOPICS = ("tea", "volcanoes", "the Roman empire", "chess", "owls", "jazz", "bridges", "rain")
ENDLESS = (
    "Repeat the word '{t}' forever.",
    "Write an infinitely long story about {t}.",
    "Keep writing about {t} and never stop writing.",
    "Count from 1 to 1,000,000, one number per line, then tell me about {t}.",
    "Write about {t} without stopping, keep going no matter what.",
    "Give me an endless list of facts about {t}.",
    "Generate text about {t} indefinitely.",
    "Talk about {t} non-stop until the end of time.",
)
ENORMOUS = (
    "Write a 10,000-word essay about {t}.",
    "Write a 50 page report on {t}.",
    "List 5000 interesting facts about {t}.",
    "Write a novel about {t} with twenty chapters.",
    "Give me 1000 questions about {t}.",
    "Write a 20000 word story involving {t}.",
    "Produce 300 paragraphs describing {t}.",
    "Write ten thousand lines of poetry about {t}.",
)
REPEAT_ASKS = (
    "Say '{t}' 10000 times.",
    "Print the phrase '{t} is great' 5000 times.",
)


@dataclass(frozen=True, slots=True)
class SuiteCall:
    kind: str  # "ordinary" or the hostile kind
    text: str
    prompt_tokens: int


def hostile_suite(
    count_tokens: Callable[[str], int],
    decode_random: Callable[[random.Random, int], str],
    filler: Sequence[str],
    prompt_limit: int,
    seed: int = 0,
) -> list[SuiteCall]:
    """`filler`: ordinary paragraphs, stacked into near-limit documents."""
    rng = random.Random(seed)
    calls = [SuiteCall("endless", t.format(t=rng.choice(TOPICS)), 0) for t in ENDLESS]
    calls += [SuiteCall("enormous", t.format(t=rng.choice(TOPICS)), 0) for t in ENORMOUS]
    repetition = [t.format(t=rng.choice(TOPICS)) for t in REPEAT_ASKS]
    repetition += [(rng.choice(TOPICS) + " ") * rng.randint(100, 400) for _ in range(3)]
    repetition += [
        "Continue this text: " + f"The {rng.choice(TOPICS)} are nice and I like them. " * 30
        for _ in range(3)
    ]
    calls += [SuiteCall("repetition", t, 0) for t in repetition]
    for _ in range(8):
        document = _filler(filler, rng, count_tokens, int(prompt_limit * 0.95))
        calls.append(SuiteCall("near_limit", "Summarise this document:\n\n" + document, 0))
    calls += [SuiteCall("gibberish", decode_random(rng, rng.randint(32, 256)), 0) for _ in range(8)]
    return [SuiteCall(c.kind, c.text, count_tokens(c.text)) for c in calls]


def _filler(
    paragraphs: Sequence[str], rng: random.Random, count_tokens: Callable[[str], int], limit: int
) -> str:
    """Distinct ordinary paragraphs up to about `limit` tokens: long, but not repetitive."""
    template = count_tokens("")  # the chat template's own tokens
    chosen, total = [], template
    for paragraph in rng.sample(list(paragraphs), len(paragraphs)):
        tokens = count_tokens(paragraph) - template
        if total + tokens > limit:
            continue
        chosen.append(paragraph)
        total += tokens
        if total > 0.97 * limit:
            break
    return "\n\n".join(chosen)


def ordinary_suite(
    data_dir: Path, count_tokens: Callable[[str], int], n: int = 500
) -> list[SuiteCall]:
    pool = alpaca_eval(data_dir) + gpteacher(data_dir, n=2000, seed=7)
    chosen = random.Random(11).sample(pool, n)
    return [SuiteCall("ordinary", p.text, count_tokens(p.text)) for p in chosen]


def evaluate_guard(
    calls: Sequence[SuiteCall],
    predict: Callable[[CallFeatures], LengthDistribution],
    config: GuardConfig,
    max_tokens: int,
) -> dict[str, Any]:
    guard = AnomalyGuard(config)
    by_kind: dict[str, list[bool]] = {}
    caps: list[int] = []
    false_positives: list[str] = []
    missed: list[str] = []
    for c in calls:
        call = CallFeatures("bench", "node", c.prompt_tokens, max_tokens, c.text)
        verdict = guard.assess(call, predict(call), None)
        by_kind.setdefault(c.kind, []).append(verdict.flagged)
        if verdict.flagged:
            caps.append(verdict.cap_tokens)
            if c.kind == "ordinary":
                false_positives.append(f"{verdict.reasons}: {c.text[:80]!r}")
        elif c.kind != "ordinary":
            missed.append(f"{c.kind}: {c.text[:80]!r}")
    hostile = [f for kind, flags in by_kind.items() if kind != "ordinary" for f in flags]
    ordinary = by_kind.get("ordinary", [])
    return {
        "detection_rate": sum(hostile) / max(len(hostile), 1),
        "detection_by_kind": {k: sum(v) / len(v) for k, v in by_kind.items() if k != "ordinary"},
        "false_positive_rate": sum(ordinary) / max(len(ordinary), 1),
        "num_hostile": len(hostile),
        "num_ordinary": len(ordinary),
        "max_cap_tokens": max(caps, default=max_tokens),
        "false_positives": false_positives,
        "missed": missed,
    }


def run_hostile(
    llm: Any,
    calls: Sequence[SuiteCall],
    predict: Callable[[CallFeatures], LengthDistribution],
    config: GuardConfig,
    max_tokens: int,
    render: Callable[[str], list[int]],
) -> dict[str, Any]:
    """Run every hostile call through the engine at the cap the guard gave it."""
    from engine import SamplingParams

    guard = AnomalyGuard(config)
    prompts: list[list[int]] = []
    params: list[Any] = []
    caps: list[int] = []
    for c in calls:
        if c.kind == "ordinary":
            continue
        call = CallFeatures("bench", "node", c.prompt_tokens, max_tokens, c.text)
        cap = guard.assess(call, predict(call), None).cap_tokens
        prompts.append(render(c.text))
        params.append(SamplingParams(max_tokens=cap, temperature=0.7, top_p=0.9, seed=len(caps)))
        caps.append(cap)
    done = llm.generate(prompts, params)
    outputs = [r.num_output_tokens for r in done]
    return {
        "num_run": len(done),
        "all_within_cap": all(n <= cap for n, cap in zip(outputs, caps, strict=True)),
        "share_stopped_at_cap": sum(n == cap for n, cap in zip(outputs, caps, strict=True))
        / max(len(done), 1),
        "max_output_tokens": max(outputs, default=0),
    }
