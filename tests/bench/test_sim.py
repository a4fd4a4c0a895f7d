import dataclasses
import json
import random
from pathlib import Path

import pytest

from bench.sched import main as sched_main
from bench.sim.metrics import jain_index, run_metrics
from bench.sim.predictions import Predictions, noisy, oracle
from bench.sim.reference import solo_call_seconds
from bench.sim.regime import gpu_regime
from bench.sim.setup import Prepared
from bench.sim.simulator import EngineSetup, Simulation
from bench.sim.study import yardstick
from bench.workloads.format import Job, Node, write_workload
from engine import EngineConfig, ReserveMode, StepTimeModel
from engine.step_fit import knee_calls
from tenants.policies import POLICY_NAMES, EngineLoad, kv_token_time, make_policy
from tests.bench.jobs import diamond

MODEL = StepTimeModel(overhead_s=0.01, per_token_s=0.001, per_context_token_s=1e-6)
BUDGET = 256


def make_setup(
    num_blocks: int = 64, knee: int | None = None, model: StepTimeModel = MODEL
) -> EngineSetup:
    config = EngineConfig(
        block_size=16,
        num_blocks=num_blocks,
        max_num_seqs=16,
        max_num_batched_tokens=BUDGET,
        max_model_len=1024,
        enable_prefix_cache=False,
        reserve_mode=ReserveMode.PREDICTED,
    )
    return EngineSetup(config, model, knee)


def single(job_id: str, tenant: str, prompt: int, output: int, arrival: float = 0.0) -> Job:
    return Job(job_id, tenant, 1.0, arrival, "chat", (Node("n", (), prompt, output, 512),))


def simulate(
    jobs: list[Job],
    policy: str,
    setup: EngineSetup,
    predictions: Predictions | None = None,
    **kwargs: int,
) -> Simulation:
    sim = Simulation(jobs, make_policy(policy, **kwargs), setup, predictions or oracle(jobs))
    sim.run()
    return sim


def test_jobs_arriving_together_finish_in_justitia_order() -> None:
    sizes = {"a": 200, "b": 20, "c": 120, "d": 60}  # output tokens; one call fits at a time
    jobs = [single(f"job-{t}", t, 100, d) for t, d in sizes.items()]
    setup = make_setup(num_blocks=20)
    finish = simulate(jobs, "justitia", setup).result.finish
    assert sorted(finish, key=finish.__getitem__) == ["job-b", "job-d", "job-c", "job-a"]
    fcfs = simulate(jobs, "fcfs", setup).result.finish
    assert sorted(fcfs, key=fcfs.__getitem__) == ["job-a", "job-b", "job-c", "job-d"]


@pytest.mark.parametrize("pair_s", [0.0, 1e-7])
def test_a_lone_call_takes_its_solo_time(pair_s: float) -> None:
    model = dataclasses.replace(MODEL, per_prefill_pair_s=pair_s)
    job = single("j", "t", 300, 40)  # a prompt of two chunks
    finish = simulate([job], "fcfs", make_setup(model=model)).result.finish["j"]
    assert finish == pytest.approx(solo_call_seconds(job.nodes[0], model, BUDGET))


def test_a_child_waits_for_its_parents_and_its_think_delay() -> None:
    job = diamond(arrival=3.0)
    plan, left, right, join = job.nodes
    finish = simulate([job], "justitia", make_setup()).result.finish["j"]

    def solo(n: Node) -> float:
        return solo_call_seconds(n, MODEL, BUDGET)

    # The right branch ends during the left one's think: every call runs alone.
    assert solo(right) < 2.0
    assert finish == pytest.approx(3.0 + solo(plan) + 2.0 + solo(left) + 1.0 + solo(join))


def random_workload(seed: int, count: int = 30) -> list[Job]:
    """Fan-out/fan-in jobs of three tenants (weights 1, 2, 3), some with think delays."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        nodes = [
            Node(
                f"m{k}",
                (),
                rng.randint(20, 200),
                rng.randint(1, 60),
                64,
                think_s=rng.choice([0.0, 0.0, 0.3]),
            )
            for k in range(rng.randint(1, 4))
        ]
        if len(nodes) > 1:
            nodes.append(Node("r", tuple(n.node_id for n in nodes), 100, rng.randint(1, 30), 64))
        tenant = i % 3
        jobs.append(
            Job(f"j{i:02d}", f"t{tenant}", 1.0 + tenant, rng.uniform(0.0, 3.0), "x", tuple(nodes))
        )
    return jobs


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("noise", [None, 0.8])
def test_everything_finishes_and_no_block_leaks(policy: str, noise: float | None) -> None:
    jobs = random_workload(seed=len(policy))
    predictions = oracle(jobs) if noise is None else noisy(jobs, noise, seed=1)
    sim = simulate(jobs, policy, make_setup(num_blocks=40), predictions=predictions)
    assert set(sim.result.finish) == {j.job_id for j in jobs}
    for job in jobs:
        assert sim.result.finish[job.job_id] > job.arrival
    blocks = sim.engine.block_manager
    blocks.check_invariants()
    assert blocks.num_free_blocks == blocks.num_blocks
    assert not sim.engine.has_unfinished
    sim.policy.check_invariants()  # type: ignore[attr-defined]
    assert sim.policy.peek(sim.engine.now(), EngineLoad(0, 0, None)) is None
    assert sim.result.output_tokens == sum(n.output_tokens for j in jobs for n in j.nodes)
    if noise is None:
        assert sim.result.preemptions == 0  # exact reservations never run out


@pytest.mark.parametrize("policy", ["fcfs", "justitia"])
def test_with_share_slots_every_call_yielded_runs_again_and_nothing_leaks(policy: str) -> None:
    jobs = random_workload(seed=3)
    setup = dataclasses.replace(make_setup(num_blocks=40, knee=6), share_slots=True)
    sim = simulate(jobs, policy, setup)
    assert set(sim.result.finish) == {j.job_id for j in jobs}
    blocks = sim.engine.block_manager
    blocks.check_invariants()
    assert blocks.num_free_blocks == blocks.num_blocks and not sim.engine.has_unfinished
    assert not sim.core.running and not sim.core.ready and not sim.produced
    # a yielded call's tokens are made again: at least every call's whole output
    assert sim.result.output_tokens >= sum(n.output_tokens for j in jobs for n in j.nodes)


def test_with_share_slots_a_light_tenant_s_call_gets_a_slot_and_the_knee_s_pace() -> None:
    # the heavy tenant's 20 long calls take all 16 slots; the light call arrives at 1 s
    heavy = [single(f"h{i}", "heavy", 40, 300) for i in range(20)]
    light = single("light", "light", 40, 20, arrival=1.0)
    plain = make_setup(num_blocks=1024, knee=8)
    shared = dataclasses.replace(plain, share_slots=True)
    # every heavy job admitted past the knee, so that its calls hold every slot
    without = simulate([*heavy, light], "justitia", plain, pampered_jobs=20)
    with_share = simulate([*heavy, light], "justitia", shared, pampered_jobs=20)
    waited = without.result.finish["light"] - 1.0
    assert with_share.result.finish["light"] - 1.0 < waited / 4  # no wait for a heavy call
    # the yielded heavy calls ran again and every job finished
    assert set(with_share.result.finish) == {j.job_id for j in [*heavy, light]}
    assert with_share.result.output_tokens > without.result.output_tokens


def test_dispatch_promises_no_block_twice_to_calls_waiting_in_the_engine() -> None:
    # 40 blocks of 16; each call needs 4 for its prompt and 8 more for its output: 3 fit, and
    # by prompts alone (what the engine counts for a waiting call) 10 would.
    jobs = [single(f"j{i}", f"t{i}", 60, 120) for i in range(10)]
    sim = Simulation(jobs, make_policy("fcfs"), make_setup(num_blocks=40), oracle(jobs))
    sim._release(0.0)
    sim._dispatch(0.0)
    blocks = sim.engine.block_manager.blocks_for
    waiting = sim.engine.scheduler.waiting
    assert len(waiting) == 3
    assert (
        sum(blocks(r.num_tokens + 120) for r in waiting) <= sim.engine.block_manager.num_free_blocks
    )
    assert simulate(jobs, "fcfs", make_setup(num_blocks=40)).result.preemptions == 0


def test_underpredicted_calls_grow_and_get_preempted_yet_finish() -> None:
    jobs = [single(f"j{i}", f"t{i}", 40, 200) for i in range(6)]
    lowball = {key: 1.0 for key in oracle(jobs)}
    sim = simulate(jobs, "vtc", make_setup(num_blocks=30), predictions=lowball)
    assert sim.result.preemptions > 0
    assert len(sim.result.finish) == 6


def test_the_knee_holds_back_all_but_the_pampered_and_the_longest_job() -> None:
    jobs = [
        single("small", "a", 100, 20),
        single("mid", "b", 100, 100),
        single("big", "c", 100, 200),
    ]
    free = simulate(jobs, "justitia", make_setup()).result.finish
    kneed = simulate(jobs, "justitia", make_setup(knee=1), pampered_jobs=1).result.finish
    assert kneed["small"] < free["small"]  # a smaller batch: faster steps
    assert kneed["mid"] > free["mid"]  # it waited for the small job to finish
    assert kneed["mid"] > kneed["small"]
    assert kneed["big"] <= free["big"]  # the longest job ran from the start


def test_service_snapshots_add_up_to_the_kv_token_time_served() -> None:
    jobs = [single("x", "a", 100, 30), single("y", "b", 50, 10, arrival=0.2)]
    sim = Simulation(jobs, make_policy("fcfs"), make_setup(), oracle(jobs), record_s=0.05)
    result = sim.run()
    times = [t for t, _ in result.service]
    assert times == sorted(times) and len(times) > 2
    final = result.service[-1][1]
    assert final["a"] == kv_token_time(100, 30) and final["b"] == kv_token_time(50, 10)


def test_study_writes_the_issue_schema(tmp_path: Path) -> None:
    rng = random.Random(0)
    jobs = [
        Job(
            f"j{i:02d}",
            f"t{i % 3}",
            1.0,
            0.1 * i,
            "fan",
            tuple(Node(f"m{k}", (), rng.randint(30, 90), rng.randint(5, 40), 64) for k in range(3)),
        )
        for i in range(40)
    ]
    workload = tmp_path / "w.jsonl"
    write_workload(workload, jobs)
    out_json = tmp_path / "s.json"
    args = [
        "--workload",
        str(workload),
        "--regimes",
        "gpu",
        "--loads",
        "0.9",
        "--policies",
        "fcfs",
        "justitia",
        "--out",
        str(tmp_path / "out"),
        "--json",
        str(out_json),
    ]
    assert sched_main(args) == 0
    summary = json.loads(out_json.read_text())
    assert set(summary) == {"headline", "cells", "cpu_knee", "attack_slowdown_honest"}
    headline = summary["headline"]
    assert set(headline) == {"avg_jct", "avg_queueing", "noisy_avg_jct", "bound_violations", "jobs"}
    assert set(headline["avg_jct"]) == set(headline["avg_queueing"]) == {"fcfs", "justitia"}
    for policy, queueing in headline["avg_queueing"].items():  # JCT less the job alone
        assert 0.0 <= queueing < headline["avg_jct"][policy]
    assert headline["jobs"] == 40
    (cell,) = summary["cells"]
    assert set(cell) == {
        "regime", "load", "avg_jct", "avg_queueing", "p99_jct", "throughput", "bound_violations"
    }  # fmt: skip
    assert cell["avg_queueing"] == headline["avg_queueing"]  # the one cell is the headline's
    assert summary["cpu_knee"] is None  # no cpu regime in this run
    assert isinstance(summary["attack_slowdown_honest"], float)
    for name in ("results.md", "details.json", "service.png", "jct_cdf.png", "workload.jsonl"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_metrics_count_bound_violations_and_jain() -> None:
    jobs = [single("x", "a", 100, 30), single("y", "b", 50, 10, arrival=1.0)]
    result = simulate(jobs, "fcfs", make_setup()).result
    gps = {"x": result.finish["x"] - 0.5, "y": result.finish["y"] - 0.01}
    solo = {"x": 0.1, "y": 0.3}
    metrics = run_metrics(
        jobs, result, gps, delta=0.1, solo_jct=solo, solo_think={"x": 0, "y": 0.2}
    )
    assert metrics.violations_by_tenant == {"a": 1, "b": 0}
    assert metrics.bound_violations == 1
    assert metrics.avg_jct == pytest.approx((result.finish["x"] + result.finish["y"] - 1.0) / 2)
    assert (metrics.avg_solo_jct, metrics.avg_solo_think) == pytest.approx((0.2, 0.1))
    assert metrics.avg_queueing == pytest.approx(metrics.avg_jct - 0.2)
    assert jain_index([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)


def test_the_solo_yardstick_splits_off_the_think_delays_on_the_critical_path() -> None:
    job = diamond(arrival=3.0, right_think=0.5)
    plan, left, _, join = job.nodes
    prepared = Prepared(gpu_regime(), make_setup(), capacity=1e4, step_seconds=0.02, context=1024)
    stick = yardstick([job], prepared)

    def solo(n: Node) -> float:
        return solo_call_seconds(n, gpu_regime().step_model, BUDGET)

    assert stick.solo["j"] == pytest.approx(solo(plan) + 2.0 + solo(left) + 1.0 + solo(join))
    assert stick.solo_think["j"] == pytest.approx(3.0)


def test_a_follower_arrives_when_the_job_before_it_finishes() -> None:
    first, second = single("a", "t", 100, 30), single("b", "t", 100, 20, arrival=99.0)
    other = single("c", "u", 100, 10, arrival=0.5)
    sim = Simulation(
        [first, other],
        make_policy("fcfs"),
        make_setup(),
        oracle([first, second, other]),
        followers={"a": second},
    )
    result = sim.run()
    assert result.arrived == {"b": result.finish["a"]}  # not its own arrival of 99 s
    assert set(result.finish) == {"a", "b", "c"} and result.finish["b"] < 99.0


def test_the_knee_reaches_its_share_of_the_full_batch_where_the_slots_end_first() -> None:
    model = StepTimeModel(overhead_s=0.052, per_token_s=0.001)

    def rate(batch: int) -> float:
        return batch / model.step_time(batch, 0)

    asymptote = knee_calls(model, mean_context=0.0)  # 80 % of 1 / per_token_s: 4 o / k, 208
    assert asymptote > 64  # past the slots of a 64-slot engine
    full = knee_calls(model, mean_context=0.0, max_batch=64)
    assert rate(full) >= 0.8 * rate(64) > rate(full - 1)  # the least batch with 80 % of 64's
    assert abs(knee_calls(model, 0.0, max_batch=10**9) - asymptote) <= 1  # the same as S grows
