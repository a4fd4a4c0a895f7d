import json
from pathlib import Path

import numpy as np
import pytest

from bench.sim.regime import gpu_regime
from bench.sim.weighted import saturated_shares
from bench.sweep import main as sweep_main
from bench.workloads.format import Job, Node
from tests.bench.fixture_data import write_data


def stream(per_tenant: int = 120) -> list[Job]:
    """Three tenants of weights 1, 2 and 4 sending alike one-call jobs at the same rate."""
    rng = np.random.default_rng(0)
    jobs = []
    for weight in (1, 2, 4):
        times = np.cumsum(rng.exponential(1.0, size=per_tenant))
        for k, t in enumerate(times):
            node = Node("n", (), int(rng.integers(80, 120)), int(rng.integers(40, 60)), 256)
            jobs.append(
                Job(f"w{weight}-{k:04d}", f"w{weight}", float(weight), float(t), "x", (node,))
            )
    return sorted(jobs, key=lambda j: (j.arrival, j.job_id))


def test_weighted_counters_split_a_saturated_engine_by_weight_and_fcfs_does_not() -> None:
    vtc = saturated_shares(stream(), gpu_regime(), "vtc")
    assert vtc.weight_share == pytest.approx({"w1": 1 / 7, "w2": 2 / 7, "w4": 4 / 7})
    assert sum(vtc.share.values()) == pytest.approx(1.0)
    assert vtc.error <= 0.1
    fcfs = saturated_shares(stream(), gpu_regime(), "fcfs")
    assert fcfs.error > 0.3  # alike arrivals, served in arrival order: about a third each
    assert fcfs.period_s == vtc.period_s


def test_sweep_judges_every_family_and_seed(tmp_path: Path) -> None:
    data = write_data(tmp_path / "data")
    out_json = tmp_path / "sweep.json"
    args = ["--data", str(data), "--families", "weighted", "fanout", "--seeds", "1"]
    args += ["--jobs", "60", "--out", str(tmp_path / "out"), "--json", str(out_json)]
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
