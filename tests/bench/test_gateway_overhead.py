"""`fairgate bench gateway` runs from the CLI as documented, through the openai backend before a
`fairgate engine serve --simulated` process: its load generator is a spawned process, which must
find its function by module name (the CLI once ran benches as __main__, and spawn could not
pickle them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.redis


def test_the_gateway_bench_runs_from_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    command = [
        sys.executable, "-m", "gateway.cli", "bench", "gateway", "--json", str(out),
        "--calls", "20", "--clients", "2", "--latency-calls", "5", "--repeats", "1",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "(openai backend)" in done.stdout and "calls/s with 2 clients" in done.stdout
    result = json.loads(out.read_text())
    assert result["backend"] == "openai" and result["calls_per_s"] > 0
    assert {"cpu_ms_per_call", "client_cpu_ms_per_call", "added_latency_ms", "runs"} <= set(result)
