import pytest

from bench.sim.deadlines import DeadlineOracle, latest_starts
from bench.workloads.format import Node
from tests.bench.jobs import diamond
from tests.tenants.policies.factories import NO_KNEE, make_job, make_node, submit


def test_a_latest_start_leaves_room_for_the_rest_of_the_longest_path() -> None:
    job = diamond(right_think=30.0)

    def seconds(node: Node) -> float:
        return float(node.output_tokens)

    exact = latest_starts([job], {"j": 100.0}, seconds, "exact")
    assert exact["j", "join"] == 100.0 - 8
    assert exact["j", "left"] == 100.0 - (30 + 1 + 8)
    assert exact["j", "right"] == 100.0 - (5 + 1 + 8)
    assert exact["j", "plan"] == 100.0 - (10 + 30 + 5 + 1 + 8)  # the right branch thinks long
    mean = latest_starts([job], {"j": 100.0}, seconds, "job-mean")
    assert mean["j", "plan"] == pytest.approx(100.0 - (10 + 11 + 30 + 11 + 8))  # mean 11
    none = latest_starts([job], {"j": 100.0}, seconds, "none")
    assert none["j", "plan"] == 100.0 - (10 + 30 + 8)


def test_calls_go_by_latest_start_and_jobs_by_reference_finish() -> None:
    gps = {"chain": 100.0, "single": 50.0}
    starts = {("chain", "a"): 10.0, ("chain", "b"): 60.0, ("single", "n"): 40.0}
    jobs = [
        make_job("chain", "t1", [make_node("a"), make_node("b", ["a"])]),
        make_job("single", "t2", [make_node("n")]),
    ]
    by_call, by_job = (DeadlineOracle(gps, starts, by_call=flag) for flag in (True, False))
    for policy in (by_call, by_job):
        for job in jobs:
            submit(policy, job)
    first = by_call.peek(0.0, NO_KNEE)
    assert first is not None and first.call_id == "chain/a"
    first = by_job.peek(0.0, NO_KNEE)
    assert first is not None and first.call_id == "single/n"
