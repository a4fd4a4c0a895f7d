"""The pools of backends the settings describe, opened for the gateway's lifetime.

No `[[backends]]` tables: one pool, the in-process engine alone (`local`), as the engine settings
describe it. Otherwise the tables are grouped by the model they serve: a pool per model, each
with its own fair share (a dispatch core of its own) and its own tokenizer, since the gateway
encodes a call's prompt once for whichever backend of its pool runs it. At most one `local`
engine (it serves the engine settings' model under its served name) and any number of `openai`
servers, each checked at start-up (its model and its tokenizer); the servers of one model name
one tokenizer folder. The first pool is the default: calls that name no model run there. A
call's length limit is its pool's smallest `max_model_len`. With `knee_calls = "auto"` the local
engine runs its calibration steps (`engine.calibration`) before the gateway serves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from engine import AsyncEngine, LLMEngine
from engine.calibration import calibrate
from gateway.backends import Backend, LocalBackend, OpenAIBackend
from gateway.backends.settings import BackendSettings
from gateway.engine_setup import build_engine_core
from gateway.settings import Settings


@dataclass(slots=True)
class Pool:
    model: str  # the served model's id: what calls name, spans and clients see
    tokenizer: Any  # encodes every prompt of the pool
    max_model_len: int
    backends: list[Backend] = field(default_factory=list)
    hidden_size: int = 0  # of the local engine's hidden states; 0: none hands them out


@dataclass(frozen=True, slots=True)
class Pools:
    pools: list[Pool]  # the default first
    engine: AsyncEngine | None  # the local engine, when a pool has it

    @property
    def max_model_len(self) -> int:
        """The smallest: the planner's default, for a call planned for no pool (each lane
        plans its calls within its own pool's, `make_lane`)."""
        return min(p.max_model_len for p in self.pools)

    @property
    def hidden_size(self) -> int:
        return max(p.hidden_size for p in self.pools)


class PoolInvalid(ValueError):
    """The backends settings describe no pools the gateway can serve."""


def check_backends(tables: Sequence[BackendSettings]) -> None:
    """Refuse pools the gateway cannot serve, before anything is started."""
    if sum(t.kind == "local" for t in tables) > 1:
        raise PoolInvalid("at most one local backend: the process has one engine")
    names = [t.display_name for t in tables]
    if len(set(names)) != len(names):
        raise PoolInvalid(f"backend names must differ: {names}")
    folders: dict[str, set[Any]] = {}
    for table in tables:
        if table.kind == "openai":
            folders.setdefault(table.model, set()).add(table.tokenizer)
    for model, named in folders.items():
        if len(named) > 1:
            raise PoolInvalid(f"the backends of model {model!r} name different tokenizers")


async def open_pools(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    core: LLMEngine | None = None,
    instant: bool = False,
) -> Pools:
    """Start every backend on `stack` (closed in reverse). `core` replaces the engine the
    settings would build; `instant` steps it on the event loop (the simulated engine)."""
    from engine.loader import load_tokenizer, served_model_name  # transformers' model code

    tables = list(settings.backends) or [BackendSettings()]
    check_backends(tables)
    pools: dict[str, Pool] = {}
    engine = None
    for table in tables:
        if table.kind == "local":
            if core is None:
                core = await anyio.to_thread.run_sync(build_engine_core, settings)
            engine = await stack.enter_async_context(AsyncEngine(core, run_in_thread=not instant))
            if settings.knee_calls == "auto":  # its knee known before the first call, and right
                await calibrate(engine)
            model = served_model_name(settings.model)
            pool = pools.setdefault(model, Pool(model, core.tokenizer, settings.max_model_len))
            pool.tokenizer = core.tokenizer  # the engine's own, whatever else serves the model
            pool.max_model_len = min(pool.max_model_len, core.config.max_model_len)  # the model's
            pool.hidden_size = core.runner.hidden_size
            pool.backends.append(LocalBackend(engine, model, table.display_name))
            continue
        assert table.tokenizer is not None  # the settings ask an openai backend for one
        if table.model not in pools:  # loaded once: the model's backends all name it
            tokenizer = await anyio.to_thread.run_sync(load_tokenizer, table.tokenizer)
            pools[table.model] = Pool(table.model, tokenizer, settings.max_model_len)
        pool = pools[table.model]
        remote = await stack.enter_async_context(OpenAIBackend(table, pool.tokenizer))
        assert remote.server is not None
        pool.max_model_len = min(pool.max_model_len, remote.server.max_model_len)
        pool.backends.append(remote)
    return Pools(list(pools.values()), engine)
