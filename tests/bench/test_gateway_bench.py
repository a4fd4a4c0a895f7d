"""`fairgate bench gateway` runs from the CLI as documented: its load generator is a spawned
process, which must find its function by module name (the CLI once ran benches as __main__,
and spawn could not pickle them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.redis


def test_the_gateway_bench_runs_from_the_cli() -> None:
    command = [
        sys.executable, "-m", "gateway.cli", "bench", "gateway",
        "--calls", "20", "--clients", "2", "--latency-calls", "5", "--repeats", "1",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "calls/s with 2 clients" in done.stdout
