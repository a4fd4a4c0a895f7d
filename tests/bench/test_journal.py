"""The journal benchmark runs from the CLI against a real Redis and reports each figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


def test_the_journal_bench_reports_reads_and_writes(tmp_path: Path) -> None:
    out = tmp_path / "journal.json"
    args = ["bench", "journal", "--redis", REDIS_URL, "--nodes", "4", "--tokens", "16"]
    assert main([*args, "--per-delta", "2", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    # ready, running, 8 deltas each, done, and the job's end
    assert result["events"] == 4 + 4 + 4 * 8 + 4 + 1
    assert result["event_bytes"] > 0 and result["snapshots"] == 0  # under SNAPSHOT_MIN_EVENTS
    # every event replayed, at the last read: all but the last node's end and the job's
    assert result["max_events_after_snapshot"] == result["events"] - 2
    for times in (result["read_ms"], result["owner_ms"]):
        assert all(t > 0 for t in times.values())
    assert result["replay_all_ms"] > 0
