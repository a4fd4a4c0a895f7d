"""`fairgate engine serve` processes for tests of a gateway in front of remote backends.

Each server runs the simulated engine over a small byte-level tokenizer (saved with a model
config in a folder the loader accepts), its steps taking `step_s` on the wall clock so that a
call lasts long enough to be cut. `engine_servers` starts them at once, waits for each to print
its address, and stops them (SIGTERM, then SIGKILL) when the block ends; `kill` ends one at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
from anyio.abc import ByteReceiveStream, Process
from prometheus_client.parser import text_string_to_metric_families
from transformers import LlamaConfig

from gateway.backends.settings import BackendSettings
from tests.gateway.conftest import byte_tokenizer

ROOT = Path(__file__).resolve().parents[2]
ANNOUNCE = "fairgate engine serving on "
MODEL = "tiny"


def model_folder(path: Path) -> Path:
    """A folder the loader accepts: a small tokenizer with a chat template and a config (the
    simulated runner needs no weights)."""
    tokenizer = byte_tokenizer()
    tokenizer.save_pretrained(path)
    config = LlamaConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    config.save_pretrained(path)
    return path


@dataclass
class EngineServer:
    name: str
    url: str
    process: Process
    folder: Path

    def backend(self, **overrides: object) -> BackendSettings:
        """The `[[backends]]` table of this server."""
        table = {"kind": "openai", "name": self.name, "url": self.url, "model": MODEL}
        table |= {"tokenizer": self.folder, "scrape_interval_s": 0.05, **overrides}
        return BackendSettings.model_validate(table)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    async def running_requests(self) -> float:
        return await server_metric(self.url, "vllm:num_requests_running")


async def server_metric(url: str, name: str) -> float:
    """A metric a vLLM-compatible server reports at `url`/metrics now (summed over series)."""
    async with httpx.AsyncClient(base_url=url) as http:
        text = (await http.get("/metrics")).text
    samples = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]
    if not samples:
        raise AssertionError(f"no {name} in {url}/metrics")
    return sum(samples)


async def _first_line(stream: ByteReceiveStream) -> str:
    received = b""
    while b"\n" not in received:
        received += await stream.receive()
    return received.split(b"\n", 1)[0].decode()


@contextlib.asynccontextmanager
async def engine_servers(
    folder: Path, count: int, step_s: float = 0.01
) -> AsyncIterator[list[EngineServer]]:
    model_folder(folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGATE_")}
    command = [sys.executable, "-m", "gateway.cli", "engine", "serve", "--port", "0"]
    command += ["--simulated", "--simulated-step-s", str(step_s), "--model", str(folder)]
    command += ["--served-model-name", MODEL]
    async with contextlib.AsyncExitStack() as stack:
        processes = [
            await stack.enter_async_context(
                await anyio.open_process(command, cwd=ROOT, env=env, stderr=None)
            )
            for _ in range(count)
        ]
        for process in processes:
            stack.push_async_callback(_stop, process)
        servers = []
        for i, process in enumerate(processes):
            assert process.stdout is not None
            with anyio.fail_after(120):  # the subprocess imports torch and transformers
                line = await _first_line(process.stdout)
            assert line.startswith(ANNOUNCE), line
            url = f"http://{line.removeprefix(ANNOUNCE)}"
            servers.append(EngineServer(f"engine-{i}", url, process, folder))
        yield servers


async def _stop(process: Process) -> None:
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(20):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
