"""One request's state inside the engine: tokens, progress, KV blocks and timing.

Invariant: `num_computed_tokens <= num_tokens`; the tokens `[0, num_computed_tokens)` have KV
in `block_ids` (in order, block_size tokens each). Preemption by recompute resets
`num_computed_tokens` to 0 and frees the blocks; the output generated so far is kept and
re-prefilled with the prompt.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    LENGTH = "length"  # max_tokens reached
    STOP = "stop"  # EOS, a stop token id or a stop string
    ABORT = "abort"
    ERROR = "error"  # the step computing it failed; the engine kept serving others


@dataclass(slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: float = 0.0  # lower runs first and is preempted last
    predicted_output_len: int | None = None  # what admission reserves KV for, when known
    cache_salt: str = ""  # prefix-cache blocks are shared only among requests with equal salts
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at last admission
    reserved_tokens: int = 0  # KV tokens admission set aside for it (allocated lazily)
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    num_recomputed_tokens: int = 0
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """`all_token_ids[start:end]`, copying only those tokens (steps stay O(new tokens))."""
        split = len(self.prompt_token_ids)
        if end <= split:
            return self.prompt_token_ids[start:end]
        if start >= split:
            return self.output_token_ids[start - split : end - split]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - split]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def sort_key(self) -> tuple[float, float, str]:
        """Total order for admission: priority, then arrival, then id."""
        return (self.priority, self.arrival_time, self.request_id)
