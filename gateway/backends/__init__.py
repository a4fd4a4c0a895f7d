"""Where calls run: the backend interface and its implementations (docs/ARCHITECTURE.md §10).

The names load on first use: `gateway.settings` imports `gateway.backends.settings`, and the CLI
must start without importing the engine and the HTTP client that the backends need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.backends.base import (
        Backend,
        BackendCall,
        BackendCapacity,
        CallStream,
        CallUsage,
        Capabilities,
    )
    from gateway.backends.breaker import BreakerState, CircuitBreaker
    from gateway.backends.errors import (
        BackendError,
        BackendLost,
        BackendMismatch,
        BackendRefused,
        BackendUnreachable,
    )
    from gateway.backends.local import LocalBackend, engine_capacity
    from gateway.backends.openai import OpenAIBackend
    from gateway.backends.settings import BackendSettings

_HOMES = {
    "Backend": "base",
    "BackendCall": "base",
    "BackendCapacity": "base",
    "CallStream": "base",
    "CallUsage": "base",
    "Capabilities": "base",
    "BreakerState": "breaker",
    "CircuitBreaker": "breaker",
    "BackendError": "errors",
    "BackendLost": "errors",
    "BackendMismatch": "errors",
    "BackendRefused": "errors",
    "BackendUnreachable": "errors",
    "LocalBackend": "local",
    "engine_capacity": "local",
    "OpenAIBackend": "openai",
    "BackendSettings": "settings",
}

__all__ = [
    "Backend",
    "BackendCall",
    "BackendCapacity",
    "BackendError",
    "BackendLost",
    "BackendMismatch",
    "BackendRefused",
    "BackendSettings",
    "BackendUnreachable",
    "BreakerState",
    "CallStream",
    "CallUsage",
    "Capabilities",
    "CircuitBreaker",
    "LocalBackend",
    "OpenAIBackend",
    "engine_capacity",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
