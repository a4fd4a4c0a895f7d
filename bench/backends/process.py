"""A model server run as a child process for the length of a benchmark (or a test session).

The server runs in its own session (so its worker processes stop with it) on a port chosen
here. Start-up waits for a line of its own output that says it accepts connections, not for a
polling loop; later output is drained and kept (the last lines), so a full pipe never blocks the
server and a failure can show what it said. Stop is SIGTERM to the whole process group, then
SIGKILL after a grace period (`kill`: SIGKILL at once, as a crash). Invariant: after `stop` or
`kill` nothing of the server is left running.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

STOP_TIMEOUT_S = 30.0
KEPT_LINES = 200


class ServerFailed(RuntimeError):
    """The server exited, or did not say it was ready in time."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def two_cores() -> str:
    """The cores this process may use, at most two, as OpenMP binds them (`0,1`)."""
    return ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))


class ServerProcess:
    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        ready: Callable[[str], bool],
        cwd: Path | None = None,
    ) -> None:
        self.command = list(command)
        self.env = dict(env)
        self.ready = ready
        self.cwd = cwd
        self.output: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._process: subprocess.Popen[str] | None = None
        self._drain = threading.Thread()

    def start(self, timeout_s: float) -> None:
        process = subprocess.Popen(
            self.command,
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its worker processes are stopped with it
        )
        self._process = process
        ready = threading.Event()
        self._drain = threading.Thread(target=self._read, args=(process, ready), daemon=True)
        self._drain.start()
        if not ready.wait(timeout_s) or process.poll() is not None:
            self.stop()
            said = "\n".join(self.output)
            raise ServerFailed(
                f"{self.command[:3]} did not start within {timeout_s:.0f} s:\n{said}"
            )

    def _read(self, process: subprocess.Popen[str], ready: threading.Event) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                self.output.append(line.rstrip())
                if self.ready(line):
                    ready.set()
        ready.set()  # it exited: `start` sees that

    @property
    def pid(self) -> int:
        assert self._process is not None, "not running"
        return self._process.pid

    def kill(self) -> None:
        """SIGKILL, as a crash would end it: nothing of it runs on, nothing of it is cleaned."""
        process, self._process = self._process, None
        if process is not None:
            _signal_group(process, signal.SIGKILL)
            process.wait()
            self._drain.join()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        _signal_group(process, signal.SIGTERM)  # its own session: the workers too
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()
        self._drain.join()


def _signal_group(process: subprocess.Popen[str], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group has exited
        os.killpg(process.pid, signum)  # start_new_session: its group id is its pid
