"""The pool of backends the settings describe, opened for the gateway's lifetime.

No `[[backends]]` tables: the in-process engine alone (`local`), as the engine settings describe
it. Otherwise every table is a backend of the one pool: at most one `local` engine and any number
of `openai` servers (each checked at start-up: its model and its tokenizer). The gateway encodes
a prompt once for whichever backend runs it, so the pool serves one model through one tokenizer:
the local engine's, or else the tokenizer folder the openai backends name (they must name the
same folder and the same model id). A call's length limit is the smallest `max_model_len` of
the pool.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import anyio

from engine import AsyncEngine, LLMEngine
from gateway.backends import Backend, LocalBackend, OpenAIBackend
from gateway.backends.settings import BackendSettings
from gateway.engine_setup import build_engine_core
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class Pool:
    backends: list[Backend]
    engine: AsyncEngine | None  # the local engine, when the pool has one
    tokenizer: Any  # encodes every prompt of the pool
    model_name: str  # the served model's id: what spans and clients see
    max_model_len: int
    hidden_size: int  # of the local engine's hidden states; 0: no backend hands them out


class PoolInvalid(ValueError):
    """The backends settings describe no pool the gateway can serve."""


def check_backends(tables: list[BackendSettings]) -> None:
    """Refuse pools the gateway cannot serve, before anything is started."""
    locals_ = [t for t in tables if t.kind == "local"]
    remote = [t for t in tables if t.kind == "openai"]
    if len(locals_) > 1:
        raise PoolInvalid("at most one local backend: the process has one engine")
    names = [t.display_name for t in tables]
    if len(set(names)) != len(names):
        raise PoolInvalid(f"backend names must differ: {names}")
    if len({t.model for t in remote}) > 1 or len({t.tokenizer for t in remote}) > 1:
        raise PoolInvalid("the openai backends of a pool serve one model with one tokenizer")


async def open_pool(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    core: LLMEngine | None = None,
    instant: bool = False,
) -> Pool:
    """Start the pool's backends on `stack` (closed in reverse). `core` replaces the engine the
    settings would build; `instant` steps it on the event loop (the simulated engine)."""
    from engine.loader import load_tokenizer, served_model_name  # transformers' model code

    tables = list(settings.backends) or [BackendSettings()]
    check_backends(tables)
    backends: list[Backend] = []
    engine = None
    tokenizer: Any = None
    model_name = ""
    limits = [settings.max_model_len]
    for table in tables:
        if table.kind == "local":
            if core is None:
                core = await anyio.to_thread.run_sync(build_engine_core, settings)
            engine = await stack.enter_async_context(AsyncEngine(core, run_in_thread=not instant))
            model_name = served_model_name(settings.model)
            backends.append(LocalBackend(engine, model_name, table.display_name))
            tokenizer = core.tokenizer
            continue
        remote = await stack.enter_async_context(OpenAIBackend(table))
        assert remote.server is not None and table.tokenizer is not None
        limits.append(remote.server.max_model_len)
        backends.append(remote)
        if tokenizer is None:
            tokenizer = await anyio.to_thread.run_sync(load_tokenizer, table.tokenizer)
            model_name = table.model
    hidden = engine.core.runner.hidden_size if engine is not None else 0
    return Pool(backends, engine, tokenizer, model_name, min(limits), hidden)
