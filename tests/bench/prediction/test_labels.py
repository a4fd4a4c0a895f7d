from pathlib import Path

import pytest

from bench.prediction.errors import LabelsInvalid
from bench.prediction.labels import HELD_OUT_EVERY, LabelRow, is_held_out, read_labels, write_labels


def test_rows_round_trip(tmp_path: Path) -> None:
    rows = [
        LabelRow("src:0", 12, (5, 9, 7, 512), 512, "gen"),
        LabelRow("src:1", 40, (100,), 512, "gen"),
    ]
    path = tmp_path / "sub" / "labels.jsonl"
    write_labels(path, rows)
    assert read_labels(path) == rows
    assert rows[0].median == 8.0


@pytest.mark.parametrize(
    "line",
    [
        '{"id": "a", "prompt_tokens": 3, "lengths": [], "max_tokens": 5, "generator": "g"}',
        '{"id": "a", "prompt_tokens": 3, "lengths": [9], "max_tokens": 5, "generator": "g"}',
        '{"id": "a", "prompt_tokens": -3, "lengths": [1], "max_tokens": 5, "generator": "g"}',
        '{"id": "a", "lengths": [1], "max_tokens": 5, "generator": "g"}',
        "not json",
    ],
)
def test_malformed_rows_are_refused_with_their_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(LabelsInvalid, match=r"labels\.jsonl:1"):
        read_labels(path)


def test_duplicates_empty_and_missing_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    write_labels(path, [LabelRow("a", 1, (1,), 5, "g"), LabelRow("a", 1, (2,), 5, "g")])
    with pytest.raises(LabelsInvalid, match="twice"):
        read_labels(path)
    path.write_text("\n")
    with pytest.raises(LabelsInvalid):
        read_labels(path)
    with pytest.raises(LabelsInvalid):
        read_labels(tmp_path / "absent.jsonl")


def test_held_out_split_is_stable_and_about_one_in_five() -> None:
    ids = [f"alpaca_eval:{i}" for i in range(2000)]
    held = [i for i in ids if is_held_out(i)]
    assert held == [i for i in ids if is_held_out(i)]
    assert abs(len(held) / len(ids) - 1 / HELD_OUT_EVERY) < 0.03
