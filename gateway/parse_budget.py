"""Each tenant's share of the event loop spent parsing its requests.

A request is parsed on the event loop once its key has passed, and protobuf holds the GIL
while it parses (a worker thread would stall the loop as long), so every tenant's calls wait
meanwhile. Parsing costs about the message's item count: a 16 MiB request of 8 million empty
nodes took 2.3 s, one of a few large strings a few milliseconds. So the time each request of a
tenant took to parse is taken from the tenant's bucket, which refills at `share` of a second a
second and holds `share` of `WINDOW_S`; a tenant whose bucket is below zero is refused
(`ParseThrottled`, with the seconds until it refills) before its next request is parsed. One
request still takes as long as its size allows (`max_message_bytes` bounds it); a tenant's
requests, one after the other, take at most about `share` of the loop. Ordinary requests
(tens of microseconds each) never come near it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from gateway.buckets import Buckets
from gateway.errors import ParseThrottled

WINDOW_S = 20.0  # a tenant's bucket holds its share of this many seconds: the burst it may take
PARSE_SHARE = 0.05


class ParseBudget:
    def __init__(self, share: float = PARSE_SHARE, clock: Callable[[], float] = time.monotonic):
        self.clock = clock  # also times the parsing: time.monotonic is as fine as perf_counter
        self._buckets = Buckets(share * WINDOW_S, share, clock)

    @contextlib.contextmanager
    def parsing(self, tenant: str) -> Iterator[None]:
        """Parse one of the tenant's requests within: refused while its bucket is below zero,
        else charged the time the block took, whatever it raised."""
        if self._buckets.level(tenant) < 0:
            raise ParseThrottled(self._buckets.wait_s(tenant, 0.0))
        began = self.clock()
        try:
            yield
        finally:
            self._buckets.add(tenant, began - self.clock())
