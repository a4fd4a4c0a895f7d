"""The backlog benchmark runs from the CLI and times every event at every backlog."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.cli import main


def test_the_backlog_bench_times_each_event_at_each_backlog(tmp_path: Path) -> None:
    out = tmp_path / "backlog.json"
    args = ["bench", "backlog", "--jobs", "0", "2", "--events", "2", "--repeats", "1"]
    assert main([*args, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result) == {"dispatch", "job end", "heads (gated)", "admission"}
    for times in result.values():
        assert set(times) == {"0", "512"} and all(t > 0 for t in times.values())
