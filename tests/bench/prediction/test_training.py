import json
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bench.prediction.errors import NotEnoughData
from bench.prediction.labels import LabelRow, is_held_out, write_hidden, write_labels
from bench.prediction.metrics import coverage, kendall_tau
from bench.prediction.training import Example, train, training_examples
from predictor.base import CallFeatures
from predictor.errors import InvalidCall
from predictor.prompt_model import PromptModel
from tests.predictor.factories import synthetic_examples


def evaluate(model_examples: list[Example], seed: int) -> tuple[float, float, float]:
    model, _ = train(model_examples, seed=seed, damps=(0.3, 1.0), hash_scales=(0.0, 1.0))
    test = synthetic_examples(150, seed=seed + 100)
    dists = [model.predict(CallFeatures("t", "n", e.prompt_tokens, 512, e.text)) for e in test]
    medians = [statistics.median(e.lengths) for e in test]
    tau = kendall_tau([d.p50 for d in dists], medians)
    p90 = coverage([d.p90 for d in dists], [e.lengths for e in test])
    p50 = coverage([d.p50 for d in dists], [e.lengths for e in test])
    return tau, p90, p50


def test_learns_length_from_phrasing_on_unseen_prompts() -> None:
    tau, p90, p50 = evaluate(synthetic_examples(300, seed=1), seed=1)
    assert tau > 0.75
    assert 0.85 <= p90 <= 0.97
    assert 0.4 <= p50 <= 0.62


def test_labels_censored_at_the_cap_keep_short_prompts_below_it() -> None:
    cap = 200  # the essay kind (median 420) always ends here, the list kind (150) often
    examples = [replace(e, max_tokens=cap) for e in synthetic_examples(300, seed=3, cap=cap)]
    model, _ = train(examples, damps=(0.3, 1.0), hash_scales=(0.0, 1.0))
    test = synthetic_examples(150, seed=103, cap=cap)
    dists = [model.predict(CallFeatures("t", "n", e.prompt_tokens, cap, e.text)) for e in test]
    essays = [d for d, e in zip(dists, test, strict=True) if "essay" in e.text]
    words = [d for d, e in zip(dists, test, strict=True) if "one word" in e.text]
    # an essay's p90 is the cap; its p50 follows its expected (capped) length, at or just under it
    assert essays and all(d.p90 == cap and 0.95 * cap <= d.p50 <= cap for d in essays)
    assert words and all(d.p90 < 20 for d in words)
    assert 0.88 <= coverage([d.p90 for d in dists], [e.lengths for e in test]) <= 0.99


def test_report_names_the_chosen_settings_and_counts() -> None:
    examples = synthetic_examples(60, seed=2)
    _, report = train(examples, damps=(1.0, 3.0), hash_scales=(1.0,))
    assert set(report.cv_tau) == {"1/1/0", "3/1/0"}  # no hidden vectors: hidden scale 0
    best = f"{report.damp:g}/{report.hash_scale:g}/{report.hidden_scale:g}"
    assert report.cv_tau[best] == max(report.cv_tau.values())
    assert report.num_prompts == 60 and report.num_samples == 240


def test_quantile_heads_are_ordered_for_typical_prompts() -> None:
    model, _ = train(synthetic_examples(120, seed=4))
    for mu in np.linspace(1, 6, 11):
        d = model.distribution(float(mu), max_tokens=10_000)
        assert d.p50 <= d.p90 <= d.p99


def test_too_few_prompts_is_an_error() -> None:
    with pytest.raises(NotEnoughData):
        train(synthetic_examples(5, seed=0), folds=5)


def test_training_is_deterministic() -> None:
    examples = synthetic_examples(80, seed=5)
    a, _ = train(examples, seed=7)
    b, _ = train(examples, seed=7)
    assert np.array_equal(a.hash_weights, b.hash_weights)
    assert a.bias == b.bias


def test_hidden_variant_learns_what_the_text_does_not_say(tmp_path: Path) -> None:
    train_set, test_set = hidden_examples(200, seed=1), hidden_examples(100, seed=2)
    prompt_only, _ = train([Example(e.text, e.prompt_tokens, e.lengths) for e in train_set])
    hidden, report = train(train_set, hidden_scales=(0.3, 1.0))
    assert report.hidden_scale in (0.3, 1.0) and hidden.hidden_size == 8
    medians = [statistics.median(e.lengths) for e in test_set]
    calls = [CallFeatures("t", "n", e.prompt_tokens, 512, e.text) for e in test_set]
    refined = [hidden.refine(c, e.hidden).p50 for c, e in zip(calls, test_set, strict=True)]
    assert kendall_tau(refined, medians) > 0.7
    assert kendall_tau([prompt_only.predict(c).p50 for c in calls], medians) < 0.3
    path = tmp_path / "h.npz"
    hidden.save(path)
    loaded = PromptModel.load(path)
    assert loaded.refine(calls[0], test_set[0].hidden).p50 == pytest.approx(refined[0], rel=1e-3)
    with pytest.raises(InvalidCall):
        loaded.refine(calls[0], [0.0] * 3)


def test_training_examples_join_labels_texts_and_hidden_vectors(tmp_path: Path) -> None:
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"text {i}"}) + "\n" for i in range(40)))
    labels = tmp_path / "labels.jsonl"
    write_labels(labels, [LabelRow(f"mine:{i}", 9, (i + 1,), 512, "gen") for i in range(40)])
    hidden = tmp_path / "hidden.npz"
    write_hidden(hidden, {f"mine:{i}": [float(i), 0.5] for i in range(0, 40, 2)})
    examples, sources = training_examples(
        [labels], tmp_path, prompt_files=[prompts], hidden_files=[hidden]
    )
    kept = {e.text for e in examples}
    expected = {f"text {i}" for i in range(0, 40, 2) if not is_held_out(f"mine:{i}")}
    assert kept == expected
    assert all(e.hidden == (float(e.text.split()[1]), 0.5) for e in examples)
    assert sources == "labels.jsonl by gen"
    everything, _ = training_examples(
        [labels], tmp_path, prompt_files=[prompts], include_held_out=True
    )
    assert len(everything) == 40 and all(e.hidden == () for e in everything)


def hidden_examples(n: int, seed: int) -> list[Example]:
    """Uninformative texts; the length is written, noisily, in the hidden vector only."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        log_len = rng.uniform(1, 6)
        hidden = tuple(log_len * (j % 3 - 1) + rng.gauss(0, 0.3) for j in range(8))
        lengths = tuple(max(1, round(math.exp(log_len + rng.gauss(0, 0.2)))) for _ in range(4))
        examples.append(Example(f"Request number {i}.", 20, lengths, hidden))
    return examples
