"""Each tenant's share of the event loop spent on its requests and their answers.

A request is parsed on the event loop once its key has passed, then converted and validated
there; every tenant's calls wait meanwhile (protobuf holds the GIL while it parses, so a worker
thread would stall the loop as long). That work costs about the request's item count, and a
refused request costs its tenant no quota: a 16 MiB request of 8 million empty nodes took 2.3 s
to parse, an invalid job of 256 densely linked nodes about 0.1 s to validate, while ordinary
requests take tens of microseconds. So the CPU time each piece of that work took beyond `FREE_S`
is taken from the tenant's bucket, which refills at `share` of a second a second and holds
`share` of `WINDOW_S`; a tenant whose bucket is below zero is refused (`LoopThrottled`, with
the seconds until it refills) before its next piece is done. The answers to its requests are
charged too (a GetJob of a job of 256 nodes of 16 KiB outputs: ~6 ms to convert), and a
stream's events as they are converted, never cut off for it: the next request pays. Ordinary
requests never touch it: a tenant sending many small jobs, alone on a replica, may use all of
its loop, as it could without the bucket with any cheap request; what the bucket stops is
requests that cost far more than that. One piece still takes as long as the request allows
(`max_message_bytes` and the job limits bound it); a tenant's costly requests, one after the
other, take at most about `share` of the loop.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator

from gateway.buckets import Buckets
from gateway.errors import LoopThrottled

WINDOW_S = 20.0  # a tenant's bucket holds its share of this many seconds: the burst it may take
LOOP_SHARE = 0.05
# a piece of work up to this long is not charged: an ordinary request's parse, conversion and
# validation take tens of microseconds to a millisecond, and charging those capped a tenant's
# plain request rate at its share of the loop even with the loop idle
FREE_S = 0.001


class _FullPasses(threading.local):
    def __init__(self) -> None:
        self.began = 0.0
        self.total = 0.0  # CPU seconds this thread spent in the collector's full passes


_full_passes = _FullPasses()


def _time_full_passes(phase: str, info: dict[str, int]) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _full_passes.began = time.thread_time()
    else:
        _full_passes.total += time.thread_time() - _full_passes.began


gc.callbacks.append(_time_full_passes)


def work_time() -> float:
    """This thread's CPU time less the collector's full passes in it. A full pass costs about
    the whole heap (a gateway holding a model and thousands of jobs: ~0.3 s) and falls in
    whichever piece of work allocated last: charged, two of them took most of a tenant's share
    though the tenant sent only ordinary jobs. The young generations' passes cost about what
    the piece itself allocated, so they stay its tenant's."""
    return time.thread_time() - _full_passes.total


class LoopBudget:
    def __init__(
        self,
        share: float = LOOP_SHARE,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = work_time,
    ):
        # The work is timed in the loop thread's CPU time (`work_time`), not on the wall: a
        # piece waits for the GIL while an engine's or gRPC's thread holds it (up to the 5 ms
        # switch interval each time) and for the core while the OS runs another process, and
        # that wait charged to whichever tenant's piece it fell in refused a tenant sending
        # ordinary jobs alone
        self.timer = timer
        self._buckets = Buckets(share * WINDOW_S, share, clock)

    def check(self, tenant: str) -> None:
        """Refuse the tenant's next piece of work while its bucket is below zero."""
        if self._buckets.level(tenant) < 0:
            raise LoopThrottled(self._buckets.wait_s(tenant, 0.0))

    @contextlib.contextmanager
    def charging(self, tenant: str) -> Iterator[None]:
        """Charge the tenant the time the block took beyond FREE_S, whatever it raised: work
        for a request already under way (an answer, a stream's events), which its next request
        pays for."""
        began = self.timer()
        try:
            yield
        finally:
            spent = self.timer() - began - FREE_S
            if spent > 0:
                self._buckets.add(tenant, -spent)

    @contextlib.contextmanager
    def spending(self, tenant: str) -> Iterator[None]:
        """Do a piece of the tenant's requests' work within: refused while its bucket is below
        zero (`check`), else `charging` it."""
        self.check(tenant)
        with self.charging(tenant):
            yield
