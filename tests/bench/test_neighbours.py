"""The neighbours benchmark runs from the CLI: a light tenant is served beside a hostile one."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.cli import main


def test_the_neighbours_bench_serves_the_light_tenant_in_each_phase(tmp_path: Path) -> None:
    out = tmp_path / "neighbours.json"
    args = ["bench", "neighbours", "--seconds", "1", "--repeats", "1", "--phases", "alone,getjob"]
    assert main([*args, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["phases"]) == {"alone", "getjob"}
    for figures in result["phases"].values():
        assert figures["calls_per_s"] > 0
        assert 0 < figures["p50_ms"] <= figures["p99_ms"]
    assert result["phases"]["getjob"]["hostile_ok"] > 0  # its GetJob calls were answered
    assert len(result["runs"]) == 1
