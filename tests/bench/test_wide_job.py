"""The wide-job benchmark runs from the CLI: one job's calls all end, each at its length."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.cli import main


def test_the_wide_job_bench_runs_every_call_to_its_length(tmp_path: Path) -> None:
    out = tmp_path / "wide.json"
    args = ["bench", "wide", "--nodes", "8", "--tokens", "32", "--repeats", "1"]
    assert main([*args, "--json", str(out)]) == 0  # it raises unless 8 x 32 tokens were made
    result = json.loads(out.read_text())
    assert result["seconds"] > 0 and result["tokens_per_s"] > 0
    assert 0 < result["longest_hold_ms"] <= result["seconds"] * 1e3
