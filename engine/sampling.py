"""Per-request sampling parameters: plain, immutable data that travels in step plans.

Validation is the engine's own guard, whatever the gateway checked first: every accepted value
keeps the sampler's arithmetic finite. Temperature is 0 (greedy) or in
[MIN_TEMPERATURE, MAX_TEMPERATURE]: dividing logits by a tinier one overflows them, and a larger
one only flattens the distribution to uniform. A seed is an unsigned 64-bit integer, the range
the sampler's seed mixing is defined on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.errors import InvalidRequest

MIN_TEMPERATURE = 0.01  # the smallest non-zero temperature accepted
MAX_TEMPERATURE = 100.0
SEED_LIMIT = 1 << 64  # seeds are in [0, SEED_LIMIT)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request's tokens are chosen and when it stops.

    temperature == 0 means greedy. top_k == 0 and top_p == 1 disable those filters.
    A seed makes a sampled request reproducible whatever else shares its batch.
    min_tokens holds back every stop but max_tokens: the sampler never draws EOS or a stop token
    id before it, and stop strings only count once it is reached.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0  # EOS, stop token ids and stop strings cannot end it before this many
    return_hidden: bool = False  # hand out the prompt's hidden state (engine/hidden.py)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequest(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        _check_temperature(self.temperature)
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")
        if any(t < 0 for t in self.stop_token_ids):
            raise InvalidRequest(f"stop_token_ids must be >= 0, got {list(self.stop_token_ids)}")
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            raise InvalidRequest(f"seed must be an unsigned 64-bit integer, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check_temperature(temperature: float) -> None:
    if temperature == 0.0:
        return
    if not (math.isfinite(temperature) and MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
        raise InvalidRequest(
            f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], "
            f"got {temperature}"
        )
