import dataclasses
import json
from pathlib import Path

from bench.sim.conservative import WITH, WITHOUT, Experiment, main, run_seed
from bench.workloads.drift import HONEST, LONG, SHORT, DriftWorkload, LengthLaw
from predictor.error_tracker import ErrorTracker

# The default workload with every length divided by four: the same story in a quarter of the
# engine steps.
SMALL = DriftWorkload(
    jobs_per_tenant=120,
    prompt=LengthLaw(64, 0.5),
    honest_output=LengthLaw(32, 0.6),
    short_output=LengthLaw(8, 0.6),
    long_output=LengthLaw(100, 0.3),
    max_tokens=128,
)


def test_the_drift_workload_turns_one_tenant_long_half_way() -> None:
    jobs = SMALL.build()
    assert jobs == SMALL.build()
    assert len(jobs) == 4 * SMALL.jobs_per_tenant
    for job in jobs:
        if job.tenant != SMALL.drifting:
            assert job.kind == HONEST
        else:
            assert job.kind == (SHORT if job.arrival < SMALL.drift_at else LONG)
    drifted = [j.nodes[0].output_tokens for j in jobs if j.kind == LONG]
    short = [j.nodes[0].output_tokens for j in jobs if j.kind == SHORT]
    assert min(drifted) > max(short)


def test_conservative_mode_shields_the_others_and_switches_within_a_window() -> None:
    # The default workload's job count: with half of it the drift is too short to push the
    # others past their bound at all, justitia keeping the drifting tenant to its share.
    workload = dataclasses.replace(SMALL, jobs_per_tenant=240)
    seed = run_seed(workload, Experiment(workload, seeds=(0,)))
    assert seed["others_violations"][WITH] < seed["others_violations"][WITHOUT]
    assert seed["others_worst_slowdown"][WITH] < seed["others_worst_slowdown"][WITHOUT]
    switch = seed["switch"]
    assert switch["conservative_before_drift"] == 0  # the drift, not noise, made it switch
    assert switch["drifted_calls_before"] is not None
    assert switch["drifted_calls_before"] <= ErrorTracker().window
    assert seed["runs"][WITHOUT]["planned_conservative"] == {}
    assert seed["met"]


def test_the_command_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "conservative.json"
    code = main(["--jobs-per-tenant", "40", "--seeds", "3", "--json", str(out)])
    data = json.loads(out.read_text())
    assert code == (0 if data["targets_met"] else 1)
    assert [s["seed"] for s in data["seeds"]] == [3]
    assert set(data["others_violations"]) == {WITH, WITHOUT}
    assert data["experiment"]["tracker_window"] == ErrorTracker().window
