"""A real uvicorn server on port 0 over the simulated engine with a small real tokenizer.

The simulated runner's tokens are a hash of the request id and position, never end-of-sequence:
a request makes exactly max_tokens unless a stop string ends it, and two requests with the same
id and prompt make the same tokens. `@pytest.mark.engine_step_s(s)` makes each step take `s`
seconds of wall time, so a test can act while a request runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from engine import AsyncEngine, LLMEngine
from engine.openai_api import build_app, listening_socket, running_server
from tests.engine.simulated import sim_core as simulated_core

MODEL = "fairgate-sim"
NUM_BLOCKS = 512
MAX_MODEL_LEN = 512


def sim_core(step_s: float = 0.0) -> LLMEngine:
    return simulated_core(step_s, NUM_BLOCKS, max_model_len=MAX_MODEL_LEN)


@dataclass
class Server:
    url: str
    engine: AsyncEngine
    openai: AsyncOpenAI
    http: httpx.AsyncClient

    @property
    def core(self) -> LLMEngine:
        return self.engine.core

    async def metrics(self) -> dict[str, float]:
        """Each sample of /metrics by name (one series per name here)."""
        return {sample.name: sample.value for sample in await self.samples()}

    async def samples(self) -> list[Sample]:
        """/metrics, parsed as Prometheus reads it."""
        response = await self.http.get("/metrics")
        assert response.status_code == 200
        families = text_string_to_metric_families(response.text)
        return [sample for family in families for sample in family.samples]


@asynccontextmanager
async def serving(core: LLMEngine, **options: Any) -> AsyncIterator[Server]:
    """The app over `core` on a listening socket (connections queue until uvicorn accepts);
    `options` go to `build_app` (its limits, an API key)."""
    async with AsyncEngine(core) as engine:
        with listening_socket("127.0.0.1", 0) as sock:
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            async with (
                running_server(build_app(engine, MODEL, **options), sock),
                AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as openai,
                httpx.AsyncClient(base_url=url) as http,
            ):
                yield Server(url, engine, openai, http)


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    marker = request.node.get_closest_marker("engine_step_s")
    async with serving(sim_core(marker.args[0] if marker else 0.0)) as running:
        yield running


async def until_idle(server: Server, timeout_s: float = 5.0) -> None:
    """Wait, bounded, for the engine to have let go of every request (`AsyncEngine.wait_idle`):
    for what the server does after the client stopped waiting, like aborting a request whose
    stream was closed."""
    with anyio.fail_after(timeout_s):
        await server.engine.wait_idle()
