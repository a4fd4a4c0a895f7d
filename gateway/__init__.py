"""fairgate's gateway: the gRPC face of the system and the wiring behind it.

A tenant's job (a DAG of LLM calls) arrives at the servicers (`service.py`, `admin_service.py`;
their messages convert in `gateway_protos.py` and `admin_protos.py`), is validated and predicted
(`jobs/`, `tickets.py`, `calls.py`), admitted against the tenant's quota (`leases.py`,
`outbox.py`), ordered by the fair-share policy and run on the engine by the dispatch loop
(`dispatch.py` around the sans-I/O `dispatch_core.py`), traced (`telemetry.py`, `spans.py`) and
streamed back (`job_run.py`). docs/ARCHITECTURE.md §2 follows one call through these rooms.

The public surface is the process: `Settings` and `load_settings` (every setting, from flags, the
environment or a TOML file), `running_gateway` (a gateway in this process, for tests and
benchmarks), `serve` (run one until a signal) and `main` (the `fairgate` command). They are
imported on first use, so importing one room of the gateway does not load the server's stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.cli import main
    from gateway.server import running_gateway, serve
    from gateway.settings import Settings, load_settings

_HOMES = {
    "Settings": "gateway.settings",
    "load_settings": "gateway.settings",
    "main": "gateway.cli",
    "running_gateway": "gateway.server",
    "serve": "gateway.server",
}
__all__ = ["Settings", "load_settings", "main", "running_gateway", "serve"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
