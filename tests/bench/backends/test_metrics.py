"""An arm's figures from fixed JCTs, the rounds' medians, the TTFT pairs and the targets."""

import pytest

from bench.backends.capacity import Capacity
from bench.backends.config import ARMS, arm_order
from bench.backends.measure import Measured
from bench.backends.metrics import Reference, arm_metrics, figures, medians, ttft_report
from bench.backends.records import ArmRun, JobRecord, LoneCall
from bench.backends.report import backend_details, table, targets
from bench.backends.workload import PlannedCall, PlannedJob, Workload
from bench.workloads.format import Job, Node
from bench.workloads.replay import to_job_spec


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


def test_the_details_keep_each_jobs_jct_and_what_it_is_judged_against() -> None:
    planned = tuple(
        PlannedJob(
            job,
            to_job_spec(job, 1.0),
            tuple(
                PlannedCall(n.node_id, n.parents, "x", (1,) * n.prompt_tokens, n.max_tokens)
                for n in job.nodes
            ),
        )
        for job in jobs()
    )
    measured = Measured(Capacity(100.0, 0.1, 5.0, 5000.0), REFERENCE)
    for arm in ARMS:
        measured.runs[arm] = [run(arm, 9.0, 4.0)]
        measured.occupancy[arm] = [{"running": 1.0, "waiting": 0.0, "process_cpu_s": 0.5}]
    details = backend_details(measured, Workload(planned, ceiling=64, dropped=0))
    assert details["jobs"]["l"] == {
        "tenant": "chat",
        "arrival": 1.0,
        "gps_finish": 3.0,
        "alone_jct": 1.0,
    }
    round_ = details["rounds"]["direct"][0]
    assert round_["jct_by_job"] == {"h": 9.0, "l": 4.0}
    assert round_["violations_by_tenant"] == {"agents": 0, "chat": 1}  # 5.0 > 3.0 + 1.0
