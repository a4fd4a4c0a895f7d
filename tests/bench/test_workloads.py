from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from bench.errors import DataMissing
from bench.workloads.agents import load_agent_tasks
from bench.workloads.arrivals import default_tenants, gamma_arrivals, load_clients
from bench.workloads.attack import ATTACKER, ATTACKER_SHARE, attacker_jobs
from bench.workloads.build import build_workload, job_work
from bench.workloads.errors import LoadUnreachable, WorkloadInvalid
from bench.workloads.families import FAMILIES, family_tenants
from bench.workloads.format import (
    Job,
    Node,
    job_from_json,
    job_to_json,
    read_workload,
    validate_workload_job,
    write_workload,
)
from bench.workloads.lengths import fit_to_context
from bench.workloads.load import OfferedLoad, at_load
from bench.workloads.replay import filler, to_job_spec
from bench.workloads.task_parallel import TASK_KINDS, load_trace_lengths
from gateway.jobs.validation import validate_job
from predictor.anomaly import AnomalyGuard
from tests.bench.fixture_data import write_data


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_data(tmp_path / "data")


def build(data: Path, seed: int = 0, num_jobs: int = 40) -> list[Job]:
    tenants = default_tenants(load_clients(data, min_windows=2))
    return build_workload(data, num_jobs, seed, context=8192, max_think_s=60.0, tenants=tenants)


def test_a_session_is_cut_into_tasks_with_subagent_fork_join(data: Path) -> None:
    first, second = load_agent_tasks(data, context=8192, max_think_s=60.0)
    by_id = {n.node_id: n for n in first}
    assert [(n.node_id, n.parents) for n in first] == [
        ("n0", ()),
        ("n1", ("n0",)),
        ("n2", ("n1",)),  # the subagent starts after the call before its marker
        ("n3", ("n2",)),
        ("n4", ("n1", "n3")),  # it ended (t=14) before call 3 started (t=30): a join
    ]
    assert [n.prompt_tokens for n in first] == [819, 1638, 410, 492, 2458]  # in * 8192/200k
    assert [n.output_tokens for n in first] == [100, 200, 50, 60, 300]
    assert by_id["n1"].think_s == 3.0 and by_id["n4"].think_s == 20.0
    assert by_id["n3"].think_s == 60.0  # clipped
    assert by_id["n0"].think_s == 0.0  # the user's pause before a task is not in the job
    (only,) = second  # 1M-token prompt and 9k output: both fitted into the window
    assert (only.prompt_tokens, only.output_tokens, only.max_tokens) == (4096, 4096, 4096)


@pytest.mark.parametrize(("prompt", "output"), [(1, 1), (50_000, 100), (10, 50_000), (0, 0)])
def test_fit_to_context_keeps_every_call_inside_the_window(prompt: int, output: int) -> None:
    p, d, max_tokens = fit_to_context(prompt, output, 8192)
    assert p >= 1 and 1 <= d <= max_tokens and p + max_tokens <= 8192
    if 1 <= output <= 4096 and prompt + output <= 8192:
        assert (p, d) == (max(prompt, 1), output)  # nothing to fit: kept


def test_clients_are_the_busiest_with_enough_windows(data: Path) -> None:
    clients = load_clients(data, min_windows=2)
    assert [c.name for c in clients] == ["chunk-1", "chunk-2", "chunk-3", "chunk-4", "chunk-5"]
    assert clients[3].mean_rate == 1.0 and clients[3].cv == pytest.approx(2.0)
    tenants = default_tenants(clients)
    assert tenants[0].name == "agents" and tenants[0].kinds == (("agent", 1.0),)
    assert sum(t.share for t in tenants) == pytest.approx(1.0)
    with pytest.raises(DataMissing):
        load_clients(data)  # no client has 100 active windows


def test_gamma_arrivals_are_sorted_inside_the_horizon() -> None:
    times = gamma_arrivals(np.random.default_rng(3), 500, cv=4.0, horizon=100.0)
    assert len(times) == 500 and np.all(np.diff(times) >= 0)
    assert times[0] >= 0 and times[-1] <= 100.0
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() > 2.0  # bursty: far above a Poisson stream's 1


def test_workload_is_deterministic_and_well_formed(data: Path, tmp_path: Path) -> None:
    jobs = build(data)
    assert jobs == build(data)
    assert jobs != build(data, seed=1)
    tenants = default_tenants(load_clients(data, min_windows=2))
    for tenant in tenants:
        assert sum(j.tenant == tenant.name for j in jobs) == round(tenant.share * 40)
    assert [j.arrival for j in jobs] == sorted(j.arrival for j in jobs)
    for job in jobs:
        validate_workload_job(job)
    path = tmp_path / "w.jsonl"
    write_workload(path, jobs)
    assert read_workload(path) == jobs


@pytest.mark.parametrize("kind", sorted(TASK_KINDS))
def test_task_parallel_jobs_join_their_branches(data: Path, kind: str) -> None:
    lengths = load_trace_lengths(data, 8192)
    nodes = TASK_KINDS[kind](np.random.default_rng(5), lengths)
    job = Job("j", "t", 1.0, 0.0, kind, nodes)
    validate_workload_job(job)
    leaves = {n.node_id for n in nodes} - {p for n in nodes for p in n.parents}
    assert len(leaves) == 1  # one call ends the job
    (last,) = [n for n in nodes if n.node_id in leaves]
    parents = [n for n in nodes if n.node_id in last.parents]
    if len(parents) > 1:  # a join reads its parents' outputs and an instruction
        assert last.prompt_tokens == 64 + sum(p.output_tokens for p in parents)


@pytest.mark.parametrize("kind", ["chain", "short_chain"])
def test_chains_run_one_call_after_another(data: Path, kind: str) -> None:
    lengths = load_trace_lengths(data, 8192)
    depths = set()
    for seed in range(20):
        nodes = TASK_KINDS[kind](np.random.default_rng(seed), lengths)
        depths.add(len(nodes))
        assert nodes[0].parents == ()
        for previous, node in pairwise(nodes):
            assert node.parents == (previous.node_id,)
            assert node.prompt_tokens > previous.output_tokens  # it reads the previous output
    assert depths == {2} if kind == "short_chain" else (min(depths) >= 2 and max(depths) <= 8)


def test_fan_out_widths(data: Path) -> None:
    lengths = load_trace_lengths(data, 8192)
    small = TASK_KINDS["small_map_reduce"](np.random.default_rng(0), lengths)
    assert len(small) == 4  # three maps and the reduce
    widths = [
        len(TASK_KINDS["wide_map_reduce"](np.random.default_rng(seed), lengths)) - 1
        for seed in range(40)
    ]
    assert max(widths) <= 64 and max(widths) > 32  # wider than the default's 32


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"servegen"}))
def test_families_build_valid_deterministic_workloads(data: Path, family: str) -> None:
    tenants = family_tenants(family, data)
    assert sum(t.share for t in tenants) == pytest.approx(1.0)
    kinds = {k for t in tenants for k, _ in t.kinds}
    assert kinds <= set(TASK_KINDS) | {"agent"}
    jobs = build_workload(data, 60, 3, context=8192, max_think_s=60.0, tenants=tenants)
    assert jobs == build_workload(data, 60, 3, context=8192, max_think_s=60.0, tenants=tenants)
    weights = {t.name: t.weight for t in tenants}
    for job in jobs:
        validate_workload_job(job)
        assert job.weight == weights[job.tenant]
    assert {j.tenant for j in jobs} == set(weights)


def test_the_weighted_family_has_weights_one_two_four(data: Path) -> None:
    assert sorted(t.weight for t in family_tenants("weighted", data)) == [1.0, 2.0, 4.0]


def test_an_unknown_family_is_named(data: Path) -> None:
    with pytest.raises(KeyError, match="known: servegen"):
        family_tenants("nope", data)


def test_mooncake_prompts_are_scaled_to_the_context(data: Path) -> None:
    lengths = load_trace_lengths(data, 8192)
    assert lengths.mooncake[:, 0].tolist() == [1024, 2048, 3072]  # 16k * (i + 1) / 16


def test_at_load_offers_the_target_load(data: Path) -> None:
    jobs = build(data)
    capacity, step = 5_000.0, 0.02
    for load in (0.5, 0.9, 1.1):
        scaled = at_load(jobs, load, capacity, step)
        assert scaled[0].arrival == 0.0
        assert [j.job_id for j in scaled] == [j.job_id for j in jobs]
        assert OfferedLoad(scaled, capacity, step).at_scale(1.0) == pytest.approx(load, rel=1e-6)
    fast = at_load(jobs, 1.1, capacity, step)
    slow = at_load(jobs, 0.5, capacity, step)
    assert fast[-1].arrival < slow[-1].arrival
    with pytest.raises(LoadUnreachable):  # a huge engine: the jobs cannot keep it busy
        at_load(jobs, 0.9, 1e9, step)


def test_offered_load_counts_only_work_inside_the_window() -> None:
    chain = tuple(
        Node(f"n{i}", (f"n{i - 1}",) if i else (), 100, 10, 10, think_s=1.0) for i in range(4)
    )
    # Alone, each call runs 10 steps of 0.1 s after a 1 s pause: calls at [1,2], [3,4], ...
    jobs = [Job("a", "t", 1.0, 0.0, "x", chain), Job("b", "t", 1.0, 4.0, "x", chain[:1])]
    offered = OfferedLoad(jobs, capacity=1000.0, step_seconds=0.1)
    call_work = job_work(Job("c", "t", 1.0, 0.0, "x", chain[:1]))
    # Window [0, 4]: job a's first two calls, none of b's (it starts at 5).
    assert offered.at_scale(1.0) == pytest.approx(2 * call_work / (4 * 10_000.0))


def test_attacker_claims_the_median_and_runs_to_max_tokens(data: Path) -> None:
    jobs = build(data)
    attackers, claimed = attacker_jobs(jobs, 8192, seed=0)
    assert len(attackers) == round(ATTACKER_SHARE * len(jobs))
    for job in attackers:
        (node,) = job.nodes
        assert job.tenant == ATTACKER and node.output_tokens == node.max_tokens
        assert node.prompt_tokens + node.max_tokens <= 8192
        assert claimed[job.job_id, node.node_id] < node.output_tokens


def bad_jobs() -> list[Job]:
    good = Job("j", "t", 1.0, 0.0, "x", (Node("a", (), 10, 5, 8), Node("b", ("a",), 10, 5, 8)))
    return [
        replace(good, nodes=(Node("a", ("b",), 10, 5, 8), Node("b", ("a",), 10, 5, 8))),
        replace(good, nodes=(Node("a", (), 10, 9, 8),)),
        replace(good, nodes=(Node("a", (), 0, 5, 8),)),
        replace(good, nodes=(Node("a", ("zz",), 10, 5, 8),)),
        replace(good, weight=0.0),
        replace(good, nodes=(Node("a", (), 10, 5, 8, think_s=-1.0),)),
    ]


@pytest.mark.parametrize("job", bad_jobs())
def test_malformed_jobs_are_refused(job: Job) -> None:
    with pytest.raises(WorkloadInvalid):
        job_from_json(job_to_json(job))


def test_a_file_with_tenants_disagreeing_on_weight_is_refused(tmp_path: Path) -> None:
    node = (Node("a", (), 10, 5, 8),)
    path = tmp_path / "w.jsonl"
    write_workload(path, [Job("x", "t", 1.0, 0.0, "k", node), Job("y", "t", 2.0, 1.0, "k", node)])
    with pytest.raises(WorkloadInvalid):
        read_workload(path)
    path.write_text('{"job_id": "x"}\n')
    with pytest.raises(WorkloadInvalid):
        read_workload(path)


def test_missing_data_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataMissing):
        load_agent_tasks(tmp_path, 8192, 60.0)
    with pytest.raises(DataMissing):
        load_trace_lengths(tmp_path, 8192)


def test_jobs_become_valid_gateway_specs(data: Path) -> None:
    for job in build(data)[:10]:
        spec = to_job_spec(job, scale=0.1)
        validate_job(spec)
        assert [n.depends_on for n in spec.nodes] == [n.parents for n in job.nodes]
        for node, spec_node in zip(job.nodes, spec.nodes, strict=True):
            assert spec_node.sampling.max_tokens == max(1, -(-node.output_tokens // 10))


def test_replay_prompts_read_as_prose_to_the_anomaly_guard() -> None:
    guard = AnomalyGuard()
    for words in (20, 100, 400):
        assert guard.prompt_signals(filler(words, f"j/n{words}")) == {}
    assert filler(50, "j/a") != filler(50, "j/b")
    assert filler(50, "j/a") == filler(50, "j/a")
