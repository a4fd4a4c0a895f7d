"""An Arize Phoenix server of the test session's own, started once and stopped at the end.

Phoenix (`arize-phoenix`, pinned) pins packages that clash with ours, so it lives in its own
virtualenv outside the clone, `~/.cache/fairgate/venvs/phoenix-<version>` (a fresh clone on the
same machine, CI's included, does not install it again). Without that virtualenv the tests that
need it are skipped, saying why, unless `FAIRGATE_REQUIRE_PHOENIX=1` (CI) installs it first. The
server binds 127.0.0.1 only, on free ports (`PHOENIX_PORT` for its HTTP API, `PHOENIX_GRPC_PORT`
for OTLP over gRPC), keeps its SQLite database in the session's temporary folder, and runs with
its telemetry and agent assistant off. Start-up waits for uvicorn's "Application startup
complete" line in its own output; later output is drained and kept (the last lines), so a full
pipe never blocks the server and a failure can show what it said. Received spans are read back
from its REST API, `GET /v1/projects/default/spans`, page by page.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.processes import free_port, signal_group

PHOENIX_VERSION = "20.26.1"
PHOENIX_PIN = f"arize-phoenix=={PHOENIX_VERSION}"
VENV_DIR = Path.home() / ".cache" / "fairgate" / "venvs" / f"phoenix-{PHOENIX_VERSION}"
REQUIRE_ENV = "FAIRGATE_REQUIRE_PHOENIX"
READY = "Application startup complete"
INSTALL_S = 900.0  # allowance for creating the virtualenv on first use (pip, about 850 MB)
START_TIMEOUT_S = 180.0  # 10 to 30 s on a busy 2-core machine, its database created anew
STOP_TIMEOUT_S = 20.0
KEPT_LINES = 200
PAGE = 1000  # spans per page of the REST API
SETTINGS = {  # loopback only, nothing sent out, no assistant able to run commands
    "PHOENIX_HOST": "127.0.0.1",
    "PHOENIX_TELEMETRY_ENABLED": "false",
    "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
    "PHOENIX_AGENTS_DISABLE_BASH": "true",
}


def phoenix_command() -> Path:
    """The virtualenv's `phoenix` command; installed on first use under
    FAIRGATE_REQUIRE_PHOENIX=1 (CI), a skip otherwise."""
    command = VENV_DIR / "bin" / "phoenix"
    if command.is_file():
        return command
    if os.environ.get(REQUIRE_ENV) == "1":
        return ensure_venv()  # a few minutes, once per machine
    pytest.skip(f"no Phoenix virtualenv at {VENV_DIR}: {REQUIRE_ENV}=1 installs it")


def ensure_venv() -> Path:
    """Create the virtualenv with the pinned Phoenix; returns its `phoenix` command."""
    python, command = VENV_DIR / "bin" / "python", VENV_DIR / "bin" / "phoenix"
    print(f"installing {PHOENIX_PIN} into {VENV_DIR} (a few minutes)", file=sys.stderr)
    steps = [
        ["python3", "-m", "venv", str(VENV_DIR)],
        [str(python), "-m", "pip", "install", "--quiet", PHOENIX_PIN],
    ]
    for step in steps:
        if subprocess.run(step, check=False).returncode != 0:
            raise RuntimeError(f"command failed: {' '.join(step)}")
    if not command.is_file():
        raise RuntimeError(f"{PHOENIX_PIN} installed no {command}")
    return command


class PhoenixServer:
    def __init__(self, command: Path, working_dir: Path) -> None:
        self.command = command
        self.working_dir = working_dir
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.started_in_s = 0.0
        self.output: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._process: subprocess.Popen[str] | None = None
        self._drain = threading.Thread()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def otlp_endpoint(self) -> str:
        """What OTEL_EXPORTER_OTLP_ENDPOINT names for OTLP over gRPC (http: no TLS)."""
        return f"http://127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        inherited = ("FAIRGATE_", "OTEL_", "PHOENIX_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
        env |= SETTINGS | {
            "PHOENIX_PORT": str(self.http_port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_WORKING_DIR": str(self.working_dir),
        }
        began = time.monotonic()
        process = subprocess.Popen(
            [str(self.command), "serve"],
            cwd=self.working_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # stopped with whatever it starts
        )
        self._process = process
        ready = threading.Event()
        self._drain = threading.Thread(target=self._read, args=(process, ready), daemon=True)
        self._drain.start()
        if not ready.wait(START_TIMEOUT_S) or process.poll() is not None:
            self.stop()
            said = "\n".join(self.output)
            raise RuntimeError(f"Phoenix did not start within {START_TIMEOUT_S:.0f} s:\n{said}")
        self.started_in_s = time.monotonic() - began

    def _read(self, process: subprocess.Popen[str], ready: threading.Event) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                self.output.append(line.rstrip())
                if READY in line:
                    ready.set()
        ready.set()  # it exited: `start` sees that

    async def spans(self, project: str = "default") -> list[dict[str, Any]]:
        """Every span the project holds, as the REST API returns them."""
        found: list[dict[str, Any]] = []
        params: dict[str, str | int] = {"limit": PAGE}
        async with httpx.AsyncClient(base_url=self.url, trust_env=False) as http:
            while True:
                reply = await http.get(f"/v1/projects/{project}/spans", params=params)
                reply.raise_for_status()
                body = reply.json()
                found.extend(body["data"])
                if not body.get("next_cursor"):
                    return found
                params["cursor"] = body["next_cursor"]

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        signal_group(process, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            signal_group(process, signal.SIGKILL)
            process.wait()
        self._drain.join()
