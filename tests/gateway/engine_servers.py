"""`fairgate engine serve` processes for tests of a gateway in front of remote backends.

Each server runs the simulated engine over a small byte-level tokenizer (saved with a model
config in a folder the loader accepts), its steps taking `step_s` on the wall clock so that a
call lasts long enough to be cut; `bench.engine_servers` starts and stops them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from transformers import LlamaConfig

from bench.engine_servers import EngineServer
from bench.engine_servers import engine_servers as server_processes
from gateway.backends.settings import BackendSettings
from tests.gateway.conftest import byte_tokenizer

MODEL = "tiny"


def model_folder(path: Path) -> Path:
    """A folder the loader accepts: a small tokenizer with a chat template and a config (the
    simulated runner needs no weights)."""
    tokenizer = byte_tokenizer()
    tokenizer.save_pretrained(path)
    config = LlamaConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    config.save_pretrained(path)
    return path


def backend_of(
    server: EngineServer, folder: Path, model: str = MODEL, **overrides: object
) -> BackendSettings:
    """The `[[backends]]` table of a server started by `engine_servers`."""
    table = {"kind": "openai", "name": server.name, "url": server.url, "model": model}
    table |= {"tokenizer": folder, "scrape_interval_s": 0.05, **overrides}
    return BackendSettings.model_validate(table)


@contextlib.asynccontextmanager
async def engine_servers(
    folder: Path, count: int, step_s: float = 0.01, model: str = MODEL
) -> AsyncIterator[list[EngineServer]]:
    model_folder(folder)
    flags = ["--simulated", "--simulated-step-s", str(step_s), "--model", str(folder)]
    async with server_processes(count, [*flags, "--served-model-name", model]) as servers:
        yield servers
