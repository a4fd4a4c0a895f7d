import csv
import json
from pathlib import Path
from typing import Any

import pytest

from bench.errors import DataMissing
from bench.paths import data_dir
from bench.workloads.engine_workload import (
    ALPACA_OUTPUTS,
    AZURE_CONV_TRACE,
    MAX_OUTPUT_LEN,
    MIN_OUTPUT_LEN,
    NUM_REQUESTS,
    build_engine_workload,
)

REAL_DATA = data_dir()
TRACE_LENGTHS = [1, 5, 15, 16, 17, 100, 129, 300, 511, 512, 513, 900, 4000]


class CharTokenizer:
    """Renders a chat as tagged text and encodes it one code point per token."""

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any:
        assert kwargs == {"tokenize": False, "add_generation_prompt": True}
        turns = "".join(f"<{m['role']}>{m['content']}" for m in conversation)
        return turns + "<assistant>"

    def encode(self, text: str, **kwargs: Any) -> Any:
        assert kwargs == {"add_special_tokens": False}
        return [ord(c) for c in text]


def make_data(root: Path, num_prompts: int = 70) -> Path:
    alpaca = root / ALPACA_OUTPUTS
    alpaca.parent.mkdir(parents=True)
    rows = [{"instruction": f"question {i}?", "output": "x"} for i in range(num_prompts)]
    alpaca.write_text(json.dumps(rows), encoding="utf-8")
    trace = root / AZURE_CONV_TRACE
    trace.parent.mkdir(parents=True)
    with trace.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for i, n in enumerate(TRACE_LENGTHS * 20):
            writer.writerow([f"2023-11-16 18:15:{i % 60:02d}", 100, n])
    return root


def test_workload_has_64_chat_prompts_in_data_order(tmp_path: Path) -> None:
    workload = build_engine_workload(make_data(tmp_path), CharTokenizer())
    assert len(workload.prompt_token_ids) == NUM_REQUESTS == len(workload.output_lens)
    decoded = ["".join(map(chr, ids)) for ids in workload.prompt_token_ids]
    assert decoded[0] == "<user>question 0?<assistant>"
    assert decoded[63] == "<user>question 63?<assistant>"


def test_lengths_are_trace_draws_clipped_to_range(tmp_path: Path) -> None:
    lens = build_engine_workload(make_data(tmp_path), CharTokenizer()).output_lens
    assert all(MIN_OUTPUT_LEN <= n <= MAX_OUTPUT_LEN for n in lens)
    allowed = {min(max(n, MIN_OUTPUT_LEN), MAX_OUTPUT_LEN) for n in TRACE_LENGTHS}
    assert set(lens) <= allowed
    assert {MIN_OUTPUT_LEN, MAX_OUTPUT_LEN} <= set(lens), "64 draws should hit both clip bounds"


def test_workload_is_deterministic_and_seeded(tmp_path: Path) -> None:
    data = make_data(tmp_path)
    first = build_engine_workload(data, CharTokenizer())
    assert build_engine_workload(data, CharTokenizer()) == first
    assert build_engine_workload(data, CharTokenizer(), seed=1).output_lens != first.output_lens
    assert first.useful_tokens == sum(first.output_lens)


def test_missing_or_short_data_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataMissing, match="not found"):
        build_engine_workload(tmp_path, CharTokenizer())
    with pytest.raises(DataMissing, match="holds 10 prompts"):
        build_engine_workload(make_data(tmp_path / "short", num_prompts=10), CharTokenizer())


@pytest.mark.skipif(not REAL_DATA.is_dir(), reason="the data directory is absent (docs/DATA.md)")
def test_real_data_workload() -> None:
    workload = build_engine_workload(REAL_DATA, CharTokenizer())
    assert len(workload.prompt_token_ids) == NUM_REQUESTS
    assert all(MIN_OUTPUT_LEN <= n <= MAX_OUTPUT_LEN for n in workload.output_lens)
    assert len(set(workload.output_lens)) > 10
    assert build_engine_workload(REAL_DATA, CharTokenizer()) == workload
