"""Prompt sets for labelling, training and evaluation, each prompt with a stable id.

Ids name the source and the row, never the text, so labels can be committed without the
prompts and joined back to them later: `alpaca_eval:<i>` is the i-th of the 805 AlpacaEval
instructions (the same order in every `results/<model>/model_outputs.json`),
`gpteacher/<subset>:<i>` the i-th row of a GPTeacher file (instruction, then its input when
there is one), `<stem>:<i>` the i-th line of a `{"prompt": ...}` JSONL file. Invariant: the
same data folder and arguments always give the same prompts in the same order.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bench.errors import DataMissing
from bench.paths import existing
from bench.prediction.errors import LabelsInvalid

ALPACA_EVAL = Path("prompts/alpaca_eval/results/gpt4_1106_preview/model_outputs.json")
ALPACA_RESULTS = Path("prompts/alpaca_eval/results")
GPTEACHER = {
    "codegen": Path("prompts/gpteacher/Codegen/codegen-instruct.json"),
    "roleplay": Path("prompts/gpteacher/Roleplay/roleplay-simple-deduped-roleplay-instruct.json"),
    "toolformer": Path("prompts/gpteacher/Toolformer/toolformer-dedupe-only-dataset.json"),
}


@dataclass(frozen=True, slots=True)
class Prompt:
    prompt_id: str
    text: str


def alpaca_eval(data_dir: Path) -> list[Prompt]:
    rows = _read_json(data_dir / ALPACA_EVAL)
    return [Prompt(f"alpaca_eval:{i}", str(row["instruction"])) for i, row in enumerate(rows)]


def gpteacher(data_dir: Path, n: int = 500, seed: int = 0) -> list[Prompt]:
    """A seeded sample of `n` prompts drawn from the union of the GPTeacher subsets."""
    pool = [p for subset in GPTEACHER for p in gpteacher_subset(data_dir, subset)]
    return random.Random(seed).sample(pool, min(n, len(pool)))


def gpteacher_subset(data_dir: Path, subset: str) -> list[Prompt]:
    rows = _read_json(data_dir / GPTEACHER[subset])
    return [Prompt(f"gpteacher/{subset}:{i}", _gpteacher_text(row)) for i, row in enumerate(rows)]


def jsonl_prompts(path: Path) -> list[Prompt]:
    if not path.is_file():
        raise DataMissing(f"{path} not found")
    prompts = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise LabelsInvalid(f'{path}:{i + 1}: expected {{"prompt": str}}')
            prompts.append(Prompt(f"{path.stem}:{i}", row["prompt"]))
    return prompts


def load_source(source: str, data_dir: Path, n: int = 500, seed: int = 0) -> list[Prompt]:
    """`alpaca_eval`, `gpteacher` (a sample of n) or the path of a JSONL prompt file."""
    if source == "alpaca_eval":
        return alpaca_eval(data_dir)
    if source == "gpteacher":
        return gpteacher(data_dir, n, seed)
    return jsonl_prompts(Path(source))


def resolve(ids: Iterable[str], data_dir: Path, extra: Iterable[Prompt] = ()) -> dict[str, str]:
    """Texts for prompt ids of the built-in sources (and of `extra` prompts), by id."""
    wanted = set(ids)
    known = {p.prompt_id: p.text for p in extra}
    if any(i.startswith("alpaca_eval:") for i in wanted):
        known.update((p.prompt_id, p.text) for p in alpaca_eval(data_dir))
    for subset in GPTEACHER:
        if any(i.startswith(f"gpteacher/{subset}:") for i in wanted):
            known.update((p.prompt_id, p.text) for p in gpteacher_subset(data_dir, subset))
    missing = wanted - known.keys()
    if missing:
        raise LabelsInvalid(f"{len(missing)} prompt ids not found, e.g. {sorted(missing)[:3]}")
    return {i: known[i] for i in wanted}


def _gpteacher_text(row: dict[str, str]) -> str:
    extra = row.get("input", "").strip()
    return f"{row['instruction']}\n\n{extra}" if extra else str(row["instruction"])


def _read_json(path: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = json.loads(existing(path).read_text(encoding="utf-8"))
    return rows
