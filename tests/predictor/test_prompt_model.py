import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from bench.prediction.training import main, train
from predictor.base import CallFeatures
from predictor.errors import ArtifactInvalid, ArtifactMissing
from predictor.features import DENSE_NAMES, HASH_DIM
from predictor.prompt_model import DEFAULT_ARTIFACT, READINGS_KEPT, PromptModel
from tests.predictor.factories import synthetic_examples


def constant_model(mu: float, heads: list[tuple[float, float]]) -> PromptModel:
    return PromptModel(
        np.zeros(len(DENSE_NAMES)), np.zeros(HASH_DIM), mu, np.array(heads), {"labels": "test"}
    )


def test_distribution_applies_heads_in_log_space_and_caps() -> None:
    model = constant_model(np.log1p(100), [(0.0, 1.0), (1.0, 1.0), (2.0, 1.0)])
    d = model.predict(CallFeatures("t", "n", 10, 10_000, "anything"))
    assert d.p50 == pytest.approx(100)
    assert d.p90 == pytest.approx(np.expm1(np.log1p(100) + 1))
    capped = model.predict(CallFeatures("t", "n", 10, 150, "anything"))
    assert capped.p90 == capped.p99 == 150


def test_a_head_at_the_cap_is_the_cap_exactly() -> None:
    # expm1(log1p(512)) is a hair under 512 in floating point: a sample at the cap must count
    # as covered by a p90 at the cap
    model = constant_model(0.0, [(float(np.log1p(512)), 0.0)] * 3)
    d = model.distribution(0.0, max_tokens=512)
    assert d.p50 == d.p90 == d.p99 == 512.0


def test_crossing_heads_are_made_monotone() -> None:
    model = constant_model(3.0, [(0.0, 1.0), (-1.0, 1.0), (0.5, 1.0)])
    d = model.distribution(3.0, max_tokens=10_000)
    assert d.p50 <= d.p90 <= d.p99
    assert d.p90 == d.p50


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    model, _ = train(synthetic_examples(60, seed=3), damps=(1.0,), hash_scales=(1.0,))
    path = tmp_path / "m.npz"
    model.save(path)
    loaded = PromptModel.load(path)
    call = CallFeatures("t", "n", 40, 512, "Write a detailed essay about the history of the river.")
    a, b = model.predict(call), loaded.predict(call)
    assert a.p50 == pytest.approx(b.p50, rel=1e-5)
    assert a.p99 == pytest.approx(b.p99, rel=1e-5)
    assert loaded.meta["format"] == "1"


def test_missing_and_foreign_artifacts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtifactMissing):
        PromptModel.load(tmp_path / "absent.npz")
    path = tmp_path / "m.npz"
    constant_model(1.0, [(0, 1), (1, 1), (2, 1)]).save(path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["meta"]))
    meta["layout"] = "hash8:other"
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    with pytest.raises(ArtifactInvalid):
        PromptModel.load(path)
    path.write_bytes(b"not a zip")
    with pytest.raises(ArtifactInvalid):
        PromptModel.load(path)


def test_observe_leaves_a_static_model_unchanged() -> None:
    model = constant_model(2.0, [(0, 1), (1, 1), (2, 1)])
    call = CallFeatures("t", "n", 10, 100, "x")
    before = model.predict(call)
    model.observe(call, 99)
    assert model.predict(call) == before


def test_train_command_writes_an_artifact_from_labels(tmp_path: Path) -> None:
    rows = []
    prompts = tmp_path / "mine.jsonl"
    examples = synthetic_examples(60, seed=9)
    prompts.write_text("".join(json.dumps({"prompt": e.text}) + "\n" for e in examples))
    for i, e in enumerate(examples):
        row = {"id": f"mine:{i}", "prompt_tokens": e.prompt_tokens, "lengths": list(e.lengths)}
        rows.append(json.dumps({**row, "max_tokens": 512, "generator": "synthetic"}))
    labels = tmp_path / "labels_mine.jsonl"
    labels.write_text("\n".join(rows) + "\n")
    out = tmp_path / "model.npz"
    main(["train", "--labels", str(labels), "--prompts", str(prompts), "--out", str(out)])
    model = PromptModel.load(out)
    assert "labels_mine.jsonl by synthetic" in model.meta["labels"]


def test_a_prompt_read_again_is_predicted_as_a_fresh_model_predicts_it() -> None:
    model = PromptModel.load(DEFAULT_ARTIFACT)
    assert model.fallback is not None  # the familiarity weight is part of what is kept
    prompts = [f"Write {i} short poems about the sea, one per line." for i in range(40)]
    calls = [
        CallFeatures("t", "n", tokens, max_tokens, text)
        for text in prompts
        for tokens, max_tokens in ((12, 512), (12, 16), (30, 512))
    ]
    for _ in range(READINGS_KEPT // len(calls) + 2):  # past the readings kept, and back
        answers = [model.predict(call) for call in calls]
    for call, answer in zip(calls, answers, strict=True):
        assert PromptModel.load(DEFAULT_ARTIFACT).predict(call) == answer
    assert len({(a.p50, a.p90) for a in answers}) > len(prompts)  # the calls differ


def test_readings_kept_do_not_hold_whole_prompts() -> None:
    """The gateway lets a prompt run to 262,144 characters (a MiB of emoji): kept whole, the
    readings would pin hundreds of MB of prompts whose jobs are long gone."""
    model = constant_model(np.log1p(100), [(0.0, 1.0), (1.0, 1.0), (2.0, 1.0)])
    tracemalloc.start()
    try:
        for i in range(READINGS_KEPT):
            model.predict(CallFeatures("t", "n", 10, 512, f"{i} " + "x" * 100_000))
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept < 2_000_000  # whole, the prompts alone would be 25 MB
