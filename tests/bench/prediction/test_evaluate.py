import json
import random
from pathlib import Path

import pytest

from bench.prediction.evaluate import accuracy, baselines, history_stream, overhead_ms
from bench.prediction.guard import SuiteCall, evaluate_guard, hostile_suite, run_hostile
from bench.prediction.labels import LabelRow, write_labels
from bench.prediction.latency import AZURE_CONV, load_trace, run_latency_bench
from bench.prediction.training import train
from engine import EngineConfig, LLMEngine, SimulatedRunner, StepTimeModel
from predictor import CallFeatures, GuardConfig, LengthDistribution
from tests.predictor.factories import synthetic_examples


def labelled_set(tmp_path: Path, n: int = 120) -> tuple[Path, Path]:
    examples = synthetic_examples(n, seed=3)
    prompts = tmp_path / "syn.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": e.text}) + "\n" for e in examples))
    rows = [
        LabelRow(f"syn:{i}", e.prompt_tokens, e.lengths, 512, "synthetic")
        for i, e in enumerate(examples)
    ]
    labels = tmp_path / "labels_syn.jsonl"
    write_labels(labels, rows)
    return labels, prompts


def test_linear_baseline_follows_prompt_length() -> None:
    train_rows = [LabelRow(f"a:{i}", 10 * i, (5 * i, 5 * i + 2), 512, "g") for i in range(1, 30)]
    predict = baselines(train_rows)
    short = predict["linear_prompt_length"](CallFeatures("t", "n", 20, 512))
    long_ = predict["linear_prompt_length"](CallFeatures("t", "n", 200, 512))
    assert short.p50 == pytest.approx(11, abs=0.5) and long_.p50 == pytest.approx(101, abs=0.5)
    assert long_.p90 >= long_.p50
    flat = predict["constant_mean"](CallFeatures("t", "n", 20, 512))
    assert flat == predict["constant_mean"](CallFeatures("t", "n", 200, 512))


def test_history_stream_predicts_before_it_observes() -> None:
    rows = [LabelRow(f"a:{i}", 5, (100,), 512, "g") for i in range(10)]
    calls = [CallFeatures("t", "n", 5, 512)] * 10
    prior_rows = [LabelRow("p:0", 5, (7,), 512, "g")]
    dists = history_stream(prior_rows, rows, calls)
    assert sum(d.p50 == 7 for d in dists) == 4  # the first min_count calls see only the prior
    assert sum(d.p50 == 100 for d in dists) == 6


def test_accuracy_reports_every_predictor_on_a_labelled_jsonl_set(tmp_path: Path) -> None:
    labels, prompts = labelled_set(tmp_path)
    model, _ = train(synthetic_examples(200, seed=8))
    result = accuracy(labels, model, tmp_path, prompts, held_out=False)
    by = result["by_predictor"]
    assert set(by) == {"constant_mean", "linear_prompt_length", "history", "prompt"}
    assert result["num_prompts"] == 120 and result["label_generator"] == ["synthetic"]
    assert by["prompt"]["kendall_tau"] > 0.7 > by["constant_mean"]["kendall_tau"]
    assert by["prompt"]["mae"] < by["constant_mean"]["mae"]
    assert 0.9 <= result["p90_coverage_floor"] <= 1.0
    held = accuracy(labels, model, tmp_path, prompts, held_out=True)
    assert 0 < held["num_prompts"] < 60


def test_overhead_is_measured_per_call() -> None:
    model, _ = train(synthetic_examples(60, seed=1), damps=(1.0,), hash_scales=(1.0,))
    result = overhead_ms(model, [("Write an essay about rivers.", 30)], n=200)
    assert 0 < result["p50"] <= result["p99"] <= result["max"]


def test_guard_bench_counts_detections_and_false_positives() -> None:
    calls = [
        SuiteCall("endless", "Repeat the word 'tea' forever.", 20),
        SuiteCall("enormous", "Tell me about tea.", 20),  # a miss
        SuiteCall("ordinary", "Tell me about tea.", 20),
        SuiteCall("ordinary", "Keep writing and never stop writing.", 20),  # a false positive
    ]
    flat = LengthDistribution.from_quantiles(50, 100, 200)
    result = evaluate_guard(calls, lambda c: flat, GuardConfig(), 512)
    assert result["detection_rate"] == 0.5 and result["false_positive_rate"] == 0.5
    assert result["detection_by_kind"] == {"endless": 1.0, "enormous": 0.0}
    assert len(result["missed"]) == 1 and len(result["false_positives"]) == 1
    assert result["max_cap_tokens"] <= 512


def test_hostile_suite_is_deterministic_and_fills_near_limit_prompts() -> None:
    def count(text: str) -> int:
        return len(text.split()) + 5

    def decode(rng: random.Random, n: int) -> str:
        return " ".join(f"x{rng.randrange(999)}q" for _ in range(n))

    filler = [f"Paragraph {i} talks about the harvest and weather." for i in range(400)]
    a = hostile_suite(count, decode, filler, prompt_limit=500)
    assert a == hostile_suite(count, decode, filler, prompt_limit=500)
    kinds = {c.kind for c in a}
    assert kinds == {"endless", "enormous", "repetition", "near_limit", "gibberish"}
    near = [c.prompt_tokens for c in a if c.kind == "near_limit"]
    assert all(0.9 * 500 <= t <= 500 for t in near)


def test_latency_replay_on_the_simulated_engine(tmp_path: Path) -> None:
    trace = tmp_path / AZURE_CONV
    trace.parent.mkdir(parents=True)
    rng = random.Random(0)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(40):
        stamp = f"2023-11-16 18:15:{i // 2:02d}.{(i % 2) * 5}000000"
        lines.append(f"{stamp},{rng.randint(20, 400)},{rng.randint(5, 80)}")
    trace.write_text("\n".join(lines) + "\n")
    calls = load_trace(tmp_path, 40, time_scale=2.0, max_prompt=300, max_output=60)
    assert calls[1].arrival_s == pytest.approx(1.0) and max(c.prompt_tokens for c in calls) <= 300
    config = EngineConfig(num_blocks=4096, enable_prefix_cache=False, max_model_len=4096)
    llm = LLMEngine(
        config, runner=SimulatedRunner(StepTimeModel(0.02, 0.0008), 1000), num_blocks=4096
    )
    result = run_latency_bench(llm, tmp_path, 40, time_scale=2.0, simulated=True)
    assert result["num_calls"] == 40
    assert result["step_overhead_ms"] == pytest.approx(20.0)
    assert result["completion_mape"] < 0.3


def test_hostile_calls_run_at_their_caps_on_the_engine() -> None:
    calls = [
        SuiteCall("endless", "Repeat the word 'tea' forever.", 12),
        SuiteCall("enormous", "Tell me about tea.", 12),  # unflagged: keeps max_tokens
        SuiteCall("ordinary", "Tell me about tea.", 12),  # not run
    ]
    flat = LengthDistribution.from_quantiles(20, 40, 70)
    config = EngineConfig(num_blocks=512, max_model_len=1024)
    llm = LLMEngine(
        config, runner=SimulatedRunner(StepTimeModel(0.01, 0.001), 1000), num_blocks=512
    )
    result = run_hostile(llm, calls, lambda c: flat, GuardConfig(), 100, lambda t: [1] * 12)
    assert result == {
        "num_run": 2,
        "all_within_cap": True,
        "share_stopped_at_cap": 1.0,  # the simulated model never stops early
        "max_output_tokens": 100,
    }
