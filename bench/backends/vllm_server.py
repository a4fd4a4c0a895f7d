"""A vLLM-CPU server of the benchmark's (or a test session's) own, started and stopped by it.

It runs `python -m vllm.entrypoints.openai.api_server` from the virtualenv the benchmarks use
(`bench.engine_speed.peers.vllm_cpu.VENV_DIR`, outside the clone; the package's `vllm` console
script fails), serving the default model's safetensors folder (`engine.loader`) under its served
name on a free port: float32, a context of `MAX_MODEL_LEN`, prefix caching off, 1 GiB of KV
cache, its OpenMP threads bound to at most two cores, and `max_num_seqs` batch slots when given
(vLLM's default otherwise). Ready when uvicorn prints "Application startup complete" (about
65-130 s on a busy 2-core machine).
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.backends.process import ServerProcess, free_port, two_cores
from engine.loader import DEFAULT_MODEL, resolve_model, served_model_name

READY = "Application startup complete"
MAX_MODEL_LEN = 1024
START_TIMEOUT_S = 600.0
KV_CACHE_GIB = 1


class VllmServer:
    def __init__(self, python: Path, max_num_seqs: int | None = None) -> None:
        self.python = python
        self.model_dir = resolve_model(DEFAULT_MODEL)  # the tokenizer is in it too
        self.model = served_model_name(DEFAULT_MODEL)
        self.port = free_port()
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", self.model,
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
            "--no-enable-prefix-caching", "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        if max_num_seqs is not None:
            command += ["--max-num-seqs", str(max_num_seqs)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGATE_")}
        env |= {
            "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
            "VLLM_CPU_OMP_THREADS_BIND": two_cores(),
        }
        self._process = ServerProcess(command, env, _ready)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def output(self) -> list[str]:
        """The server's last lines of output."""
        return list(self._process.output)

    def start(self) -> None:
        self._process.start(START_TIMEOUT_S)

    def stop(self) -> None:
        self._process.stop()


def _ready(line: str) -> bool:
    return READY in line
