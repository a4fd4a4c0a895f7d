"""The engine benchmark's workload: 64 real prompts with exact output lengths from a real trace.

Prompts are the first `n` AlpacaEval instructions, each rendered as one user turn with the model's
chat template (generation prompt added) and tokenized without extra special tokens, as
`apply_chat_template(tokenize=True)` does. Output lengths are `n` draws with replacement from the
Azure 2023 conversation trace's `GeneratedTokens`, made by numpy `default_rng(seed)` and clipped to
[min_len, max_len]. Invariant: the same data, tokenizer and seed always give the same workload, and
every output length lies within the clip range; engines must generate exactly those lengths.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bench.errors import DataMissing
from bench.paths import existing

ALPACA_OUTPUTS = Path("prompts/alpaca_eval/results/gpt4_1106_preview/model_outputs.json")
AZURE_CONV_TRACE = Path("traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
NUM_REQUESTS = 64
MIN_OUTPUT_LEN = 16
MAX_OUTPUT_LEN = 512


class ChatTokenizer(Protocol):
    """The two methods of a HuggingFace tokenizer that the workload uses."""

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class EngineWorkload:
    prompt_token_ids: list[list[int]]
    output_lens: list[int]  # exact number of tokens each request must generate

    @property
    def useful_tokens(self) -> int:
        return sum(self.output_lens)

    def to_json(self) -> dict[str, list[list[int]] | list[int]]:
        return {"prompt_token_ids": self.prompt_token_ids, "output_lens": self.output_lens}


def load_instructions(data_dir: Path, n: int) -> list[str]:
    path = existing(data_dir / ALPACA_OUTPUTS)
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [str(row["instruction"]) for row in rows[:n]]


def sample_output_lens(
    data_dir: Path, n: int, seed: int = 0, lo: int = MIN_OUTPUT_LEN, hi: int = MAX_OUTPUT_LEN
) -> list[int]:
    path = existing(data_dir / AZURE_CONV_TRACE)
    with path.open(newline="", encoding="utf-8") as f:
        generated = np.array([int(row["GeneratedTokens"]) for row in csv.DictReader(f)])
    draws = np.random.default_rng(seed).choice(generated, size=n, replace=True)
    return [int(x) for x in np.clip(draws, lo, hi)]


def build_engine_workload(
    data_dir: Path, tokenizer: ChatTokenizer, n: int = NUM_REQUESTS, seed: int = 0
) -> EngineWorkload:
    prompts = []
    for instruction in load_instructions(data_dir, n):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": instruction}], tokenize=False, add_generation_prompt=True
        )
        prompts.append([int(t) for t in tokenizer.encode(str(text), add_special_tokens=False)])
    if len(prompts) < n:
        raise DataMissing(f"{data_dir / ALPACA_OUTPUTS} holds {len(prompts)} prompts, need {n}")
    return EngineWorkload(prompts, sample_output_lens(data_dir, n, seed))
