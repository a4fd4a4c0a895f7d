"""What the servers of other projects share: a free port, and stopping a process group."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def signal_group(process: subprocess.Popen[str], signum: int) -> None:
    """Signal the process and all it started (it was started with `start_new_session`)."""
    with contextlib.suppress(ProcessLookupError):  # the whole group has exited
        os.killpg(process.pid, signum)  # start_new_session: its group id is its pid
