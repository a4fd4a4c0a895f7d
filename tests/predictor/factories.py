"""Small synthetic prompt sets whose output lengths follow their phrasing, for training tests."""

from __future__ import annotations

import math
import random

from bench.prediction.training import Example

TOPICS = (
    "river", "castle", "robot", "garden", "violin", "glacier", "market", "comet", "forest",
    "bridge", "lantern", "harbor", "desert", "orchard", "engine", "library", "meadow", "tower",
)  # fmt: skip
KINDS = (  # (template, median output length)
    ("Answer in one word: what colour is the {t}?", 4),
    ("Translate to French: the {t} is near.", 14),
    ("Give a short definition of a {t}.", 40),
    ("List some ideas for a party themed on the {t}.", 150),
    ("Write a detailed essay about the history of the {t}.", 420),
)


def synthetic_examples(n: int, seed: int, samples: int = 4, cap: int = 512) -> list[Example]:
    """`n` prompts; each length is lognormal around its kind's median (sigma 0.3), capped."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        template, median = rng.choice(KINDS)
        text = template.format(t=rng.choice(TOPICS))
        lengths = tuple(
            min(cap, max(1, round(median * math.exp(rng.gauss(0, 0.3))))) for _ in range(samples)
        )
        examples.append(Example(text, prompt_tokens=30 + len(text) // 4, lengths=lengths))
    return examples
