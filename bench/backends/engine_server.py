"""`fairgate engine serve` as the benchmark's second backend: the real SmolLM2 engine.

One server, started and stopped by `bench.engine_servers` and sized like the vLLM server it is
compared with: the same model under the same served name, float32, a context of `MAX_MODEL_LEN`,
1 GiB of KV cache, `slots` batch slots (a settings file passed as `--config`) and two threads.
Its prefix cache stays on (no setting turns it off): the benchmark's prompts differ from call
to call and share only the chat template's opening.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from bench.backends.config import BenchConfig
from bench.backends.measure import Measured, measure_backend
from bench.backends.vllm_server import KV_CACHE_GIB, MAX_MODEL_LEN
from bench.backends.workload import Workload
from bench.engine_servers import engine_servers
from engine.loader import DEFAULT_MODEL, resolve_model, served_model_name

THREADS = 2


@dataclass(frozen=True, slots=True)
class Served:
    url: str
    model: str  # the model id it serves
    model_dir: Path  # its tokenizer and chat template


def settings_toml(slots: int) -> str:
    return (
        f"max_num_seqs = {slots}\nmax_model_len = {MAX_MODEL_LEN}\n"
        f"kv_cache_mb = {KV_CACHE_GIB << 10}\n"
    )


async def measure_engine_server(
    workload: Workload, config: BenchConfig, log: Callable[[str], None]
) -> Measured:
    """Start the server, measure it as `measure_backend` does, stop it."""
    model = served_model_name(DEFAULT_MODEL)
    settings = config.out / "engine-serve.toml"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(settings_toml(config.slots), encoding="utf-8")
    flags = ["--host", "127.0.0.1", "--served-model-name", model]
    flags += ["--num-threads", str(THREADS), "--config", str(settings)]
    started = anyio.current_time()
    async with engine_servers(1, flags) as (server,):
        log(f"fairgate-engine: up in {anyio.current_time() - started:.0f} s")
        served = Served(server.url, model, resolve_model(DEFAULT_MODEL))
        return await measure_backend(served, workload, config, log)
