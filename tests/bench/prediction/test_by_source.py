import math
import random

import numpy as np
import pytest

from bench.prediction.by_source import (
    fit_all,
    group_by_source,
    leave_one_source_out,
    online_errors,
    source_of,
)
from bench.prediction.errors import NotEnoughData
from bench.prediction.labels import LabelRow
from predictor.distribution import LengthDistribution
from tests.predictor.factories import synthetic_examples

SMALL_GRID = {"damps": (1.0,), "hash_scales": (1.0,), "hidden_scales": (1.0,), "folds": 2}


def test_a_prompt_id_names_its_source_before_its_row() -> None:
    assert source_of("alpaca_eval:12") == "alpaca_eval"
    assert source_of("gpteacher/codegen:7") == "gpteacher/codegen"


def test_online_correction_is_scored_after_the_warmup_on_the_same_calls() -> None:
    rng = random.Random(0)

    def samples() -> tuple[int, ...]:
        return tuple(min(512, round(300 * math.exp(rng.gauss(0, 0.3)))) for _ in range(4))

    rows = [LabelRow(f"s:{i}", 10, samples(), 512, "g") for i in range(80)]
    short = [LengthDistribution.from_quantiles(60, 200, 400)] * len(rows)
    bare, corrected = online_errors(short, rows, warmup=30)
    assert bare == pytest.approx(np.mean([r.median - 60 for r in rows[30:]]))
    assert corrected is not None and bare is not None and corrected < 0.5 * bare
    assert online_errors(short[:30], rows[:30], warmup=30) == (None, None)


def labelled(
    sources: dict[str, int], seed: int
) -> tuple[list[LabelRow], dict[str, str], dict[str, tuple[float, ...]]]:
    """Synthetic prompts under several source names, each with a hidden vector that carries
    its log length (as the real hidden states carry much of it)."""
    rng = np.random.default_rng(seed)
    rows, texts, vectors = [], {}, {}
    for offset, (name, n) in enumerate(sources.items()):
        for i, e in enumerate(synthetic_examples(n, seed=seed + offset)):
            pid = f"{name}:{i}"
            rows.append(LabelRow(pid, e.prompt_tokens, e.lengths, 512, "synthetic"))
            texts[pid] = e.text
            vectors[pid] = (float(np.log1p(np.mean(e.lengths))), *rng.normal(size=3))
    return rows, texts, vectors


def test_leave_one_source_out_reports_every_predictor_per_source() -> None:
    rows, texts, vectors = labelled({"a": 40, "b": 30, "gpteacher/c": 24}, seed=1)
    groups = group_by_source(rows)
    report = leave_one_source_out(groups, texts, fit_all(groups, texts, vectors, **SMALL_GRID), 25)
    assert set(report) == {"a", "b", "gpteacher/c"}
    expected = {
        "constant_mean", "linear_prompt_length", "history", "prompt", "prompt (no fallback)",
        "prompt+hidden",
    }  # fmt: skip
    for source, result in report.items():
        assert result["num_prompts"] == len(groups[source])
        for key in ("kendall_tau", "mae", "p90_coverage", "mae_after_50", "mae_online_after_50"):
            assert set(result[key]) == expected
    assert report["a"]["kendall_tau"]["prompt (no fallback)"] > 0.5  # the kinds carry over
    assert report["a"]["mae_online_after_50"]["constant_mean"] is not None
    assert report["gpteacher/c"]["mae_online_after_50"]["prompt"] is None  # 24 <= warmup


def test_a_left_out_sources_labels_reach_none_of_its_models() -> None:
    rows, texts, vectors = labelled({"a": 30, "b": 30, "c": 30}, seed=2)
    changed = [
        LabelRow(r.prompt_id, r.prompt_tokens, (1, 2, 3, 4), 512, "g")
        if source_of(r.prompt_id) == "a" else r
        for r in rows
    ]  # fmt: skip
    fits = [fit_all(group_by_source(x), texts, vectors, **SMALL_GRID) for x in (rows, changed)]
    for name in ("prompt", "prompt+hidden"):
        before, after = fits[0]["a"][name], fits[1]["a"][name]
        assert np.array_equal(before.model.hash_weights, after.model.hash_weights)
        assert before.held_out.familiarity == after.held_out.familiarity
        assert before.held_out.predicted == after.held_out.predicted
        assert fits[0]["b"][name].model.bias != fits[1]["b"][name].model.bias


def test_fewer_than_three_sources_cannot_calibrate_on_held_out_ones() -> None:
    rows, _, _ = labelled({"a": 10, "b": 10}, seed=3)
    with pytest.raises(NotEnoughData):
        group_by_source(rows)
