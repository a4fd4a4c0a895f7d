"""Job deadlines: one timer task for all jobs, calling back when a job's deadline passes.

Deadlines sit in a heap ordered by time; the task sleeps until the earliest one (or until a new
earlier one arrives) and reports each job whose deadline has passed exactly once, unless it was
discarded first (the job ended) or added again (moved: the latest counts). A discarded or moved
deadline stays in the heap until it comes to the top, so the heap is rebuilt from the live ones
once the stale outnumber them: jobs submitted with far deadlines and cancelled at once would
otherwise pile up behind one earlier live deadline. Times are the injected clock's (unix seconds
for `JobSpec.deadline_unix_s`, the journaling's monotonic clock for its fencing deadlines).
Invariant: the heap holds at most twice the live deadlines, plus `_SLACK`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import anyio

_SLACK = 64  # discarded entries tolerated before a rebuild is worth it


class Deadlines:
    def __init__(self, clock: Callable[[], float], on_expired: Callable[[str], None]) -> None:
        self.clock = clock
        self.on_expired = on_expired
        self._heap: list[tuple[float, str]] = []
        self._live: dict[str, float] = {}  # job id -> deadline, while not discarded
        self._wake = anyio.Event()

    def add(self, job_id: str, at: float) -> None:
        """The job's deadline, replacing the one it had."""
        self._live[job_id] = at
        heapq.heappush(self._heap, (at, job_id))
        self._compact()
        self._wake.set()

    def discard(self, job_id: str) -> None:
        self._live.pop(job_id, None)
        self._compact()

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + _SLACK:
            self._heap = [(at, job) for job, at in self._live.items()]
            heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._live)

    async def run(self) -> None:
        while True:
            self._fire_due()
            self._wake = anyio.Event()
            delay = self._heap[0][0] - self.clock() if self._heap else None
            with anyio.move_on_after(delay):
                await self._wake.wait()

    def _fire_due(self) -> None:
        now = self.clock()
        while self._heap and (self._heap[0][0] <= now or self._heap[0][1] not in self._live):
            at, job_id = heapq.heappop(self._heap)
            if self._live.get(job_id) == at:
                del self._live[job_id]
                self.on_expired(job_id)
