"""An arm's figures from fixed JCTs, the rounds' medians, the TTFT pairs and the targets."""

import pytest

from bench.backends.config import ARMS, arm_order
from bench.backends.metrics import Reference, arm_metrics, figures, medians, ttft_report
from bench.backends.records import ArmRun, JobRecord, LoneCall
from bench.backends.report import table, targets
from bench.workloads.format import Job, Node


def jobs() -> list[Job]:
    heavy = Job("h", "agents", 1.0, 0.0, "agent", (Node("n", (), 10, 20, 20),))
    light = Job("l", "chat", 1.0, 1.0, "chat", (Node("n", (), 10, 5, 5),))
    return [heavy, light]


def run(arm: str, jct_heavy: float, jct_light: float) -> ArmRun:
    return ArmRun(
        arm,
        {
            "h": JobRecord("h", "agents", 0.0, jct_heavy),
            "l": JobRecord("l", "chat", 1.0, 1.0 + jct_light),
        },
    )


REFERENCE = Reference(gps={"h": 8.0, "l": 3.0}, delta_s=1.0, alone={"h": 6.0, "l": 1.0})


def test_an_arm_is_judged_by_the_studys_metrics() -> None:
    m = arm_metrics(jobs(), run("direct", 10.0, 4.0), REFERENCE)
    assert m.avg_jct == pytest.approx(7.0)
    assert m.avg_queueing == pytest.approx(((10 - 6) + (4 - 1)) / 2)
    assert m.throughput == pytest.approx(25 / 10.0)  # output tokens, first arrival to last finish
    # h ends at 10 > 8 + 1; l ends at 5 > 3 + 1
    assert m.violations_by_tenant == {"agents": 1, "chat": 1}
    assert m.worst_slowdown == {"agents": pytest.approx(10 / 8), "chat": pytest.approx(4 / 2)}
    f = figures(m)
    assert f["worst_slowdown"] == pytest.approx(2.0)
    assert f["bound_violations"] == 2


def test_medians_are_per_arm_and_figure() -> None:
    runs = {
        "direct": [arm_metrics(jobs(), run("direct", t, 2.0), REFERENCE) for t in (7, 9, 20)],
        "fairgate-justitia": [arm_metrics(jobs(), run("x", 7.0, 1.0), REFERENCE)],
    }
    out = medians(runs)
    assert out["avg_jct"]["direct"] == pytest.approx((9 + 2) / 2)
    assert out["avg_jct"]["fairgate-justitia"] == pytest.approx(4.0)
    assert set(out) >= {"avg_queueing", "throughput", "bound_violations", "worst_slowdown", "jain"}


def test_added_ttft_is_fairgates_less_its_servers_part_and_the_paired_one_is_reported() -> None:
    # (direct, fairgate, the server's part of fairgate's): the server's TTFT varies from one
    # send of a prompt to the next, which the paired difference takes for fairgate's
    calls = [
        LoneCall(0.100, 0.110, 0.104),
        LoneCall(0.200, 0.205, 0.199),
        LoneCall(0.150, 0.290, 0.280),
    ]
    report = ttft_report(calls)
    assert report["direct_ttft_ms"]["p50"] == pytest.approx(150.0)
    assert report["added_ttft_ms"]["p50"] == pytest.approx(6.0)
    assert 6.0 < report["added_ttft_ms"]["p99"] <= 10.0
    assert report["paired_added_ttft_ms"]["p50"] == pytest.approx(10.0)
    assert 10.0 < report["paired_added_ttft_ms"]["p99"] <= 140.0


def test_targets_and_table() -> None:
    arms = dict.fromkeys(ARMS, 0.0)
    report = {
        "backend": "vllm-cpu",
        "jobs": 200,
        "avg_jct": arms | {"direct": 10.0, "fairgate-justitia": 6.0},
        "avg_queueing": arms | {"direct": 5.0, "fairgate-justitia": 3.0},
        "p99_jct": arms,
        "throughput": arms | {"direct": 100.0, "fairgate-justitia": 96.0},
        "bound_violations": arms | {"direct": 7.0, "fairgate-justitia": 1.0},
        "worst_slowdown": arms,
        "jain": arms,
        "added_ttft_ms": {"p50": 5.0, "p99": 25.0},
        "paired_added_ttft_ms": {"p50": 4.0, "p99": 60.0},
        "direct_ttft_ms": {"p50": 100.0, "p99": 150.0},
    }
    judged = targets(report, {"light_violations": {"direct": 3.0}})
    assert judged["queueing"]["met"] and judged["throughput"]["met"]
    assert judged["bound_violations"]["met"]  # 1 <= 0.5 % of 200, and direct broke light jobs
    assert not judged["added_ttft"]["met"]  # 25 ms > 0.2 x 100 ms
    assert "| fairgate-justitia | 6 | 3 |" in table(report)


def test_each_round_rotates_the_arms() -> None:
    assert [arm_order(r)[0] for r in range(4)] == [ARMS[0], ARMS[1], ARMS[2], ARMS[0]]
    assert all(sorted(arm_order(r)) == sorted(ARMS) for r in range(3))
