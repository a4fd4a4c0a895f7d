"""The open event streams (WatchJob, RunJob, Generate): counted per tenant, closable at once.

A stream opens under its caller (tenant and key) and counts against the tenant's
`max_streams`; one over the limit is refused before any work (RESOURCE_EXHAUSTED,
QUOTA_STREAMS). Revoking a key or deleting a tenant closes its streams: `close` marks each
handle and wakes the job it watches, whose watch loop then stops and the RPC ends with
UNAUTHENTICATED.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.job_run import JobRun
from gateway.tenant_counts import TenantCounts
from tenants import refusals


@dataclass(eq=False, slots=True)
class Stream:
    tenant_id: str
    key_id: str
    run: JobRun | None = None
    closed: str = ""  # why it was closed from outside; '' while open

    def watch(self, run: JobRun) -> None:
        self.run = run

    def is_closed(self) -> bool:
        return bool(self.closed)


class OpenStreams:
    def __init__(self) -> None:
        self._open: set[Stream] = set()
        self._per_tenant = TenantCounts()

    @contextlib.contextmanager
    def open(self, tenant_id: str, key_id: str, limit: int) -> Iterator[Stream]:
        """Register a stream for as long as the block runs; `limit` 0 means no limit."""
        with self._per_tenant.holding(tenant_id, limit, refusals.streams):
            stream = Stream(tenant_id, key_id)
            self._open.add(stream)
            try:
                yield stream
            finally:
                self._open.discard(stream)

    def close(self, which: Callable[[Stream], bool], reason: str) -> int:
        """Close the open streams `which` selects; returns how many."""
        closing = [s for s in self._open if which(s) and not s.closed]
        for stream in closing:
            stream.closed = reason
            if stream.run is not None:
                stream.run.poke()
        return len(closing)

    def count(self, tenant_id: str) -> int:
        return self._per_tenant[tenant_id]
