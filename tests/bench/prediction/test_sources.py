import json
from pathlib import Path

import pytest

from bench.errors import DataMissing
from bench.prediction.errors import LabelsInvalid
from bench.prediction.sources import (
    ALPACA_EVAL,
    GPTEACHER,
    alpaca_eval,
    gpteacher,
    jsonl_prompts,
    load_source,
    resolve,
)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    alpaca = tmp_path / ALPACA_EVAL
    alpaca.parent.mkdir(parents=True)
    alpaca.write_text(
        json.dumps([{"instruction": f"question {i}", "output": "x"} for i in range(5)])
    )
    for subset, rel in GPTEACHER.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True)
        rows = [
            {"instruction": f"{subset} task {i}", "input": "data" if i % 2 else ""}
            for i in range(4)
        ]
        path.write_text(json.dumps(rows))
    return tmp_path


def test_alpaca_ids_follow_row_order(data_dir: Path) -> None:
    prompts = alpaca_eval(data_dir)
    assert [p.prompt_id for p in prompts] == [f"alpaca_eval:{i}" for i in range(5)]
    assert prompts[3].text == "question 3"


def test_gpteacher_sample_is_seeded_and_joins_input(data_dir: Path) -> None:
    a, b = gpteacher(data_dir, n=6, seed=1), gpteacher(data_dir, n=6, seed=1)
    assert a == b and len(a) == 6
    assert gpteacher(data_dir, n=6, seed=2) != a
    texts = {p.prompt_id: p.text for p in gpteacher(data_dir, n=100)}
    assert len(texts) == 12
    assert texts["gpteacher/codegen:1"] == "codegen task 1\n\ndata"
    assert texts["gpteacher/codegen:0"] == "codegen task 0"


def test_jsonl_prompts_and_resolve(tmp_path: Path, data_dir: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "hello"}\n\n{"prompt": "bye"}\n')
    prompts = load_source(str(path), data_dir)
    assert [(p.prompt_id, p.text) for p in prompts] == [("mine:0", "hello"), ("mine:2", "bye")]
    texts = resolve(["mine:2", "alpaca_eval:1", "gpteacher/roleplay:3"], data_dir, prompts)
    assert texts == {
        "mine:2": "bye",
        "alpaca_eval:1": "question 1",
        "gpteacher/roleplay:3": "roleplay task 3\n\ndata",
    }
    with pytest.raises(LabelsInvalid):
        resolve(["alpaca_eval:99"], data_dir)


def test_missing_and_malformed_sources(tmp_path: Path) -> None:
    with pytest.raises(DataMissing):
        alpaca_eval(tmp_path)
    with pytest.raises(DataMissing):
        jsonl_prompts(tmp_path / "absent.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(LabelsInvalid):
        jsonl_prompts(bad)
