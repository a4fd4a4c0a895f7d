"""A redis-server of the test's own, on its own port, with an append-only file fsynced always.

The test can kill it (SIGKILL), start it again on the same port and directory (the AOF brings
every acknowledged write back), and freeze it (SIGSTOP) and thaw it (SIGCONT). Start-up waits
for the server's own "Ready to accept connections" line, not for a polling loop.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest

READY = b"Ready to accept connections"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed")
        self.directory = directory
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._drain = threading.Thread()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", "always",
            "--save", "", "--daemonize", "no",
        ]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert process.stdout is not None
        for line in process.stdout:
            if READY in line:
                break
        else:
            raise RuntimeError(f"redis-server exited with {process.wait()}")
        # its later log lines are read and dropped, so a full pipe never blocks the server
        self._drain = threading.Thread(target=_drain, args=(process,), daemon=True)
        self._drain.start()
        self._process = process

    def kill(self) -> None:
        process = self._running()
        process.kill()
        process.wait()
        self._drain.join()
        self._process = None

    def freeze(self) -> None:
        self._running().send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._running().send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)
            self.kill()

    def _running(self) -> subprocess.Popen[bytes]:
        assert self._process is not None, "redis-server is not running"
        return self._process


def _drain(process: subprocess.Popen[bytes]) -> None:
    assert process.stdout is not None
    with process.stdout:
        process.stdout.read()
