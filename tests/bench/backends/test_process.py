"""The servers under test run ahead of the benchmark's own process on the cores they share."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.backends.process import SERVER_NICE, prioritized


def test_a_prioritized_command_runs_at_a_higher_priority_where_it_may() -> None:
    probe = [sys.executable, "-c", "import os; print(os.nice(0))"]
    done = subprocess.run(prioritized(probe), capture_output=True, text=True, check=True)
    ours = os.nice(0)
    # raising a priority needs privilege: without it the command runs as it is
    expected = max(ours + SERVER_NICE, -20) if os.geteuid() == 0 else ours
    assert int(done.stdout) == expected
