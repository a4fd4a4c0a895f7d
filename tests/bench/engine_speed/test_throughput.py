import json

from bench.engine_speed.peers.protocol import WorkerResult
from bench.engine_speed.throughput import build_report, format_table, greedy_mismatches, plan_runs

CEILING = {"ceiling_tok_s": {"fp32": 400.0, "bf16": 1400.0}, "gemm_flops": {}, "params": 1}


def result(tok_s: list[float], tokens: list[list[int]], startup_s: float = 1.0) -> WorkerResult:
    return WorkerResult(startup_s, [1.0] * len(tok_s), tok_s, tokens)


def test_plan_runs_every_engine_per_dtype_in_order() -> None:
    keys = [r.key for r in plan_runs(["fairgate", "vllm-cpu"], ["fp32", "bf16"])]
    assert keys == ["fairgate/fp32", "vllm-cpu/fp32", "fairgate/bf16", "vllm-cpu/bf16"]


def test_greedy_mismatches_names_differing_requests() -> None:
    assert greedy_mismatches([[1, 2], [3]], [[1, 2], [3]]) == []
    assert greedy_mismatches([[1, 2], [3]], [[1, 9], [3]]) == [0]
    assert greedy_mismatches([[1]], [[1], [2]]) == [0, 1]


def test_report_takes_medians_ratios_and_greedy_match() -> None:
    results = {
        "fairgate/fp32": result([300.0, 100.0, 200.0], [[1, 2], [3]]),
        "hf-static/fp32": result([50.0], [[1, 2], [3]]),
        "vllm-cpu/fp32": result([400.0], [[1, 2], [4]], startup_s=80.0),
        "fairgate/bf16": result([500.0], [[7]]),
    }
    report = build_report(results, CEILING, {"hf-cb/fp32": "exit 1"})
    assert report["tok_s"]["fairgate/fp32"] == 200.0
    assert report["ratio_to_vllm"]["fairgate/fp32"] == 0.5
    assert report["ratio_to_vllm"]["fairgate/bf16"] is None
    assert report["greedy_match"] is True
    assert report["vllm_startup_s"] == 80.0
    assert report["ceiling_tok_s"] == {"fp32": 400.0, "bf16": 1400.0}
    json.dumps(report)
    table = format_table(report)
    assert "fairgate/fp32" in table and "hf-cb/fp32       FAILED: exit 1" in table


def test_report_greedy_match_is_false_on_any_difference_and_none_without_pair() -> None:
    ours, theirs = result([1.0], [[1, 2]]), result([1.0], [[1, 3]])
    report = build_report({"fairgate/fp32": ours, "hf-static/fp32": theirs}, CEILING, {})
    assert report["greedy_match"] is False
    assert report["greedy_mismatched_requests"] == [0]
    assert build_report({"fairgate/fp32": ours}, CEILING, {})["greedy_match"] is None
