"""Per-request sampling parameters: plain, immutable data that travels in step plans."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request's tokens are chosen and when it stops.

    temperature == 0 means greedy. top_k == 0 and top_p == 1 disable those filters.
    A seed makes a sampled request reproducible whatever else shares its batch.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    return_hidden: bool = False  # hand out the prompt's hidden state (engine/hidden.py)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidRequest("max_tokens must be >= 1")
        if self.temperature < 0:
            raise InvalidRequest("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise InvalidRequest("top_k must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
