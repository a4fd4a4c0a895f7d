"""The longest the event loop went without coming back to a task that yields at every turn:
what one piece of work held every other task (every tenant's RPCs and streams) up."""

from __future__ import annotations

import time

import anyio.lowlevel


class LoopWatch:
    def __init__(self) -> None:
        self.longest = 0.0
        self.watching = True

    async def watch(self) -> None:
        """Run beside the work (in a task group) until `watching` is set False."""
        last = time.perf_counter()
        while self.watching:
            await anyio.lowlevel.checkpoint()
            now = time.perf_counter()
            self.longest, last = max(self.longest, now - last), now
