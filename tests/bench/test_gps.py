import random

import pytest

from bench.sim.gps import GpsCall, GpsJob, gps_finish_times, water_fill
from tenants.policies import InvalidJob, kv_token_time


def single(
    job_id: str, tenant: str, prompt: int, output: int, *, weight: float = 1.0, arrival: float = 0.0
) -> GpsJob:
    return GpsJob(job_id, tenant, weight, arrival, (GpsCall("n", (), prompt, output),))


def test_water_fill_caps_small_demands_and_shares_the_rest_by_weight() -> None:
    assert water_fill(100.0, [10.0, 500.0, 500.0], [1.0, 1.0, 3.0]) == pytest.approx(
        [10.0, 22.5, 67.5]
    )
    assert water_fill(100.0, [10.0, 20.0], [1.0, 1.0]) == [10.0, 20.0]


def test_a_call_alone_runs_a_token_a_step() -> None:
    finish = gps_finish_times([single("j", "t", 100, 40, arrival=3.0)], 1e9, step_seconds=0.5)
    assert finish == {"j": pytest.approx(3.0 + 40 * 0.5)}


def test_two_tenants_share_equally_while_both_are_active() -> None:
    # p=100: the footprints (105.5 and 110.5 slots) exceed the 25 each gets.
    finish = gps_finish_times([single("a", "x", 100, 10), single("b", "y", 100, 20)], 50.0)
    short, long_ = kv_token_time(100, 10), kv_token_time(100, 20)
    assert finish["a"] == pytest.approx(short / 25)
    assert finish["b"] == pytest.approx(short / 25 + (long_ - short) / 50)


def test_what_a_job_cannot_use_goes_to_the_others() -> None:
    # "a" can use only 5.5 slots (p=0, d=10); "b" takes the other 94.5.
    finish = gps_finish_times([single("a", "x", 0, 10), single("b", "y", 200, 10)], 100.0)
    assert finish["a"] == pytest.approx(10.0)
    assert finish["b"] == pytest.approx(10 + (kv_token_time(200, 10) - 10 * 94.5) / 100)


def test_tenants_share_by_weight_and_a_tenants_jobs_equally() -> None:
    jobs = [
        single("heavy1", "heavy", 100, 10, weight=2.0),
        single("heavy2", "heavy", 100, 10, weight=2.0),
        single("light", "light", 100, 20, weight=1.0),
    ]
    finish = gps_finish_times(jobs, 30.0)  # heavy: 20 (10 a job), light: 10
    heavy_done = kv_token_time(100, 10) / 10
    assert finish["heavy1"] == finish["heavy2"] == pytest.approx(heavy_done)
    light_left = kv_token_time(100, 20) - 10 * heavy_done
    assert finish["light"] == pytest.approx(heavy_done + light_left / 30)


def test_a_chain_runs_call_after_call_and_pauses_for_think_time() -> None:
    calls = (GpsCall("a", (), 50, 10), GpsCall("b", ("a",), 80, 4, delay=5.0))
    finish = gps_finish_times([GpsJob("j", "t", 1.0, 2.0, calls)], 1e9, step_seconds=0.5)
    assert finish["j"] == pytest.approx(2.0 + 10 * 0.5 + 5.0 + 4 * 0.5)


def test_a_paused_job_cedes_its_share() -> None:
    think = GpsJob("think", "x", 1.0, 0.0, (GpsCall("n", (), 100, 10, delay=50.0),))
    busy = single("busy", "y", 100, 100)
    finish = gps_finish_times([think, busy], 50.0)
    # "busy" has all 50 slots for the 50 steps "think" waits, then half.
    served_alone = 50 * 50
    both = kv_token_time(100, 10) / 25
    assert finish["think"] == pytest.approx(50 + both)
    assert finish["busy"] == pytest.approx(
        50 + both + (kv_token_time(100, 100) - served_alone - 25 * both) / 50
    )


def test_zero_output_calls_finish_at_once() -> None:
    calls = (GpsCall("a", (), 50, 0), GpsCall("b", ("a",), 50, 0))
    assert gps_finish_times([GpsJob("j", "t", 1.0, 7.0, calls)], 10.0) == {"j": 7.0}


def random_jobs(seed: int, arrive_together: bool) -> list[GpsJob]:
    rng = random.Random(seed)
    weights = {"a": 1.0, "b": 3.0, "c": 0.5}
    jobs = []
    for i in range(20):
        tenant = rng.choice(sorted(weights))
        calls = []
        for k in range(rng.randint(1, 5)):
            parents = tuple(f"n{p}" for p in range(k) if rng.random() < 0.4)
            calls.append(GpsCall(f"n{k}", parents, rng.randint(100, 300), rng.randint(1, 50)))
        arrival = 0.0 if arrive_together else rng.uniform(0, 500)
        jobs.append(GpsJob(f"j{i}", tenant, weights[tenant], arrival, tuple(calls)))
    return jobs


@pytest.mark.parametrize("seed", range(5))
def test_binding_capacity_is_never_idle(seed: int) -> None:
    jobs = random_jobs(seed, arrive_together=True)
    total = sum(kv_token_time(c.prompt_tokens, c.output_tokens) for j in jobs for c in j.calls)
    finish = gps_finish_times(jobs, 40.0)  # below every call's footprint
    assert max(finish.values()) == pytest.approx(total / 40.0)


@pytest.mark.parametrize("seed", range(5))
def test_no_job_beats_its_critical_path_or_its_arrival(seed: int) -> None:
    jobs = random_jobs(seed, arrive_together=False)
    finish = gps_finish_times(jobs, 2000.0)
    for job in jobs:
        longest: dict[str, float] = {}
        for call in job.calls:  # listed parents-first
            before = max((longest[p] for p in call.parents), default=0.0)
            longest[call.node_id] = before + call.output_tokens
        assert finish[job.job_id] >= job.arrival + max(longest.values()) - 1e-6


@pytest.mark.parametrize(
    "jobs",
    [
        [single("a", "t", 1, 1, weight=1.0), single("b", "t", 1, 1, weight=2.0)],
        [GpsJob("j", "t", 1.0, 0.0, (GpsCall("a", ("b",), 1, 1), GpsCall("b", ("a",), 1, 1)))],
        [single("a", "t", 1, 1), single("a", "u", 1, 1)],
        [GpsJob("j", "t", 1.0, 0.0, (GpsCall("a", (), -1, 1),))],
    ],
)
def test_invalid_workloads_are_rejected(jobs: list[GpsJob]) -> None:
    with pytest.raises(InvalidJob):
        gps_finish_times(jobs, 10.0)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        gps_finish_times([single("a", "t", 1, 1)], 0.0)
