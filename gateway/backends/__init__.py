"""Where calls run: the backend interface and its implementations (docs/ARCHITECTURE.md §10)."""

from gateway.backends.base import (
    Backend,
    BackendCall,
    BackendCapacity,
    CallStream,
    CallUsage,
    Capabilities,
)
from gateway.backends.errors import BackendError, BackendLost
from gateway.backends.local import LocalBackend, engine_capacity

__all__ = [
    "Backend",
    "BackendCall",
    "BackendCapacity",
    "BackendError",
    "BackendLost",
    "CallStream",
    "CallUsage",
    "Capabilities",
    "LocalBackend",
    "engine_capacity",
]
