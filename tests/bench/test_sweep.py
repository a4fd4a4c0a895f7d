import json
from pathlib import Path

import numpy as np
import pytest

from bench.sim.regime import gpu_regime
from bench.sim.weighted import closed_loop, saturated_shares
from bench.sweep import main as sweep_main
from bench.workloads.format import Job, Node
from tests.bench.fixture_data import write_data


def alike(per_tenant: int = 150) -> list[Job]:
    """Three tenants of weights 1, 2 and 4 with alike one-call jobs."""
    rng = np.random.default_rng(0)
    jobs = []
    for weight in (1, 2, 4):
        for k in range(per_tenant):
            node = Node("n", (), int(rng.integers(80, 120)), int(rng.integers(40, 60)), 256)
            job = Job(f"w{weight}-{k:04d}", f"w{weight}", float(weight), float(k), "x", (node,))
            jobs.append(job)
    return jobs


def spread(per_tenant: int = 300) -> list[Job]:
    """Three tenants of weights 1, 2 and 4 with one-call jobs of log-normal lengths (median
    40 tokens, sigma 0.5): each tenant's shortest jobs have the earliest tags."""
    rng = np.random.default_rng(0)
    jobs = []
    for weight in (1, 2, 4):
        for k in range(per_tenant):
            output = int(min(512, max(1, rng.lognormal(np.log(40), 0.5))))
            node = Node("n", (), int(rng.integers(80, 120)), output, 512)
            job = Job(f"w{weight}-{k:04d}", f"w{weight}", float(weight), float(k), "x", (node,))
            jobs.append(job)
    return jobs


def test_a_closed_loop_deals_each_tenants_jobs_to_its_clients_in_order() -> None:
    first, followers = closed_loop(alike(5), clients=2)
    assert sorted(j.job_id for j in first) == [f"w{w}-000{k}" for w in (1, 2, 4) for k in (0, 1)]
    assert all(j.arrival == 0.0 for j in first)
    assert followers["w1-0000"].job_id == "w1-0002" and followers["w1-0002"].job_id == "w1-0004"
    assert "w1-0004" not in followers and followers["w2-0001"].job_id == "w2-0003"


@pytest.mark.parametrize("policy", ["vtc", "justitia"])
def test_a_saturated_engine_is_split_by_weight(policy: str) -> None:
    shares = saturated_shares(alike(300), gpu_regime(), policy)
    assert shares.weight_share == pytest.approx({"w1": 1 / 7, "w2": 2 / 7, "w4": 4 / 7})
    assert sum(shares.share.values()) == pytest.approx(1.0)
    assert shares.error <= 0.1


def test_justitia_keeps_tenants_of_spread_job_lengths_to_their_weights() -> None:
    # By finish tags alone the heaviest tenant's many short jobs ran ahead of its share (0.61 of
    # the service to weight 4's 0.57: an error of 0.20).
    shares = saturated_shares(spread(), gpu_regime(), "justitia")
    assert shares.error <= 0.1


def test_fcfs_splits_a_saturated_engine_by_who_sends_not_by_weight() -> None:
    fcfs = saturated_shares(alike(300), gpu_regime(), "fcfs")
    assert fcfs.error > 0.3  # alike clients served in the order they send: about a third each


def test_sweep_judges_every_family_and_seed(tmp_path: Path) -> None:
    data = write_data(tmp_path / "data")
    out_json = tmp_path / "sweep.json"
    args = ["--data", str(data), "--families", "weighted", "fanout", "--seeds", "1"]
    args += [
        "--jobs",
        "60",
        "--weighted-jobs",
        "90",
        "--out",
        str(tmp_path / "out"),
        "--json",
        str(out_json),
    ]
    assert sweep_main(args) == 0
    summary = json.loads(out_json.read_text())
    runs = [(r["family"], r["seed"]) for r in summary["runs"]]
    assert runs == [("weighted", 1), ("fanout", 1)]
    for run in summary["runs"]:
        names = {t["name"] for t in run["targets"] if t["value"] is not None}
        assert "1. queueing justitia / sjf-oracle" in names
        assert "3. attack: honest tenants' slowdown" in names
        head = run["summary"]["headline"]
        assert set(head["avg_queueing"]) == {"fcfs", "vtc", "justitia", "sjf-oracle"}
    weighted = summary["weighted"]
    assert [(w["seed"], w["policy"]) for w in weighted] == [(1, "justitia"), (1, "vtc")]
    for w in weighted:
        assert sum(w["share"].values()) == pytest.approx(1.0)
    report = (tmp_path / "out" / "sweep.md").read_text()
    assert "| fanout | 1 |" in report
