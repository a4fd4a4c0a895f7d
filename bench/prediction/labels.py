"""Output-length labels: per prompt, the lengths of several sampled answers, and no text.

One JSON object a line: `{"id": prompt id, "prompt_tokens": int, "lengths": [int, ...],
"max_tokens": int, "generator": str}`. `prompt_tokens` counts the chat-templated prompt in the
serving model's tokenizer; `lengths` are output tokens of independent samples, each at most
`max_tokens` (a length equal to it was cut off). The median is the point label and the spread
is what a predicted distribution must cover. Invariant: rows read back equal rows written, and
every row has at least one length within `[0, max_tokens]`.

The prompts' hidden states (engine/hidden.py; for the `hidden` predictor) live beside the
labels in an `.npz` of `ids` and a float16 `vectors` matrix, one row per id.

The train/test split is by prompt, never by row: a prompt is held out when the CRC-32 of its
id is divisible by `HELD_OUT_EVERY`, so every tool agrees on the split without a file.
"""

from __future__ import annotations

import json
import statistics
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.prediction.errors import LabelsInvalid

HELD_OUT_EVERY = 5  # about one prompt in five is held out for evaluation


def is_held_out(prompt_id: str) -> bool:
    return zlib.crc32(prompt_id.encode()) % HELD_OUT_EVERY == 0


@dataclass(frozen=True, slots=True)
class LabelRow:
    prompt_id: str
    prompt_tokens: int
    lengths: tuple[int, ...]
    max_tokens: int
    generator: str

    def __post_init__(self) -> None:
        if not self.lengths or any(not 0 <= n <= self.max_tokens for n in self.lengths):
            raise LabelsInvalid(f"{self.prompt_id}: lengths must be in [0, {self.max_tokens}]")
        if self.prompt_tokens < 0:
            raise LabelsInvalid(f"{self.prompt_id}: prompt_tokens must be >= 0")

    @property
    def median(self) -> float:
        return float(statistics.median(self.lengths))

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.prompt_id,
            "prompt_tokens": self.prompt_tokens,
            "lengths": list(self.lengths),
            "max_tokens": self.max_tokens,
            "generator": self.generator,
        }


def write_labels(path: Path, rows: Iterable[LabelRow]) -> None:
    """Replace `path` with `rows` atomically: a run stopped mid-write leaves the old file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row.to_json(), separators=(",", ":")) + "\n")
    partial.replace(path)


def read_labels(path: Path) -> list[LabelRow]:
    if not path.is_file():
        raise LabelsInvalid(f"{path} not found")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            rows.append(
                LabelRow(
                    str(raw["id"]),
                    int(raw["prompt_tokens"]),
                    tuple(int(n) for n in raw["lengths"]),
                    int(raw["max_tokens"]),
                    str(raw["generator"]),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LabelsInvalid(f"{path}:{number}: {exc}") from exc
    if not rows:
        raise LabelsInvalid(f"{path} holds no labels")
    ids = [r.prompt_id for r in rows]
    if len(set(ids)) != len(ids):
        raise LabelsInvalid(f"{path} labels some prompt twice")
    return rows


def write_hidden(path: Path, vectors: dict[str, list[float]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = sorted(vectors)
    matrix = np.array([vectors[i] for i in ids], dtype=np.float16)
    with path.open("wb") as f:
        np.savez_compressed(f, ids=np.array(ids), vectors=matrix)


def read_hidden(path: Path) -> dict[str, tuple[float, ...]]:
    if not path.is_file():
        raise LabelsInvalid(f"{path} not found")
    try:
        with np.load(path, allow_pickle=False) as data:
            ids, matrix = data["ids"], data["vectors"].astype(np.float64)
    except (OSError, KeyError, ValueError) as exc:
        raise LabelsInvalid(f"{path}: {exc}") from exc
    if matrix.ndim != 2 or len(ids) != len(matrix):
        raise LabelsInvalid(f"{path}: expected one vector per id")
    return {str(i): tuple(float(x) for x in row) for i, row in zip(ids, matrix, strict=True)}
