"""`fairgate engine serve` processes, for benchmarks and tests of a gateway before remote engines.

`engine_servers` starts `count` servers at once with the given flags (each on a free port),
waits for each to print its address, yields them, and stops them when the block ends (SIGTERM,
then SIGKILL after a grace). A server's own output goes to this process's stderr, so a failure
shows what it said.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
from anyio.abc import ByteReceiveStream, Process
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
ANNOUNCE = "fairgate engine serving on "
START_TIMEOUT_S = 180.0  # the process imports torch and transformers, maybe loads a model
STOP_GRACE_S = 20.0


@dataclass
class EngineServer:
    name: str
    url: str  # http://host:port
    process: Process

    def kill(self) -> None:
        """End the server at once, as a crash would."""
        self.process.send_signal(signal.SIGKILL)


@contextlib.asynccontextmanager
async def engine_servers(count: int, flags: Sequence[str]) -> AsyncIterator[list[EngineServer]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGATE_")}
    command = [sys.executable, "-m", "gateway.cli", "engine", "serve", "--port", "0", *flags]
    async with contextlib.AsyncExitStack() as stack:
        processes = []
        for _ in range(count):
            process = await anyio.open_process(command, cwd=ROOT, env=env, stderr=None)
            stack.push_async_callback(_stop, process)
            processes.append(process)
        servers = []
        for i, process in enumerate(processes):
            assert process.stdout is not None
            with anyio.fail_after(START_TIMEOUT_S):
                line = await _first_line(process.stdout)
            if not line.startswith(ANNOUNCE):
                raise RuntimeError(f"fairgate engine serve said {line!r} instead of its address")
            servers.append(EngineServer(f"engine-{i}", f"http://{line[len(ANNOUNCE) :]}", process))
        yield servers


async def _first_line(stream: ByteReceiveStream) -> str:
    received = b""
    while b"\n" not in received:
        received += await stream.receive()
    return received.split(b"\n", 1)[0].decode()


async def _stop(process: Process) -> None:
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(STOP_GRACE_S):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()


async def server_metric(url: str, name: str) -> float:
    """A metric the server at `url` (a vLLM-compatible one, or a gateway's metrics port)
    reports now on /metrics, summed over its series; LookupError when it reports none."""
    async with httpx.AsyncClient(base_url=url, trust_env=False) as http:
        text = (await http.get("/metrics")).text
    samples = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]
    if not samples:
        raise LookupError(f"no {name} in {url}/metrics")
    return sum(samples)
