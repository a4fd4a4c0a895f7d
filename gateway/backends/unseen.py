"""Room on a remote backend: its last scrape, less the calls it had not shown when scraped,
plus those it counted that have ended since.

A server's metrics lag the gateway: a call sent a moment ago is in nobody's scrape yet. So each
call sent is booked here with its slot and its KV (prompt plus predicted output, in blocks) until
a scrape is known to count it. A call counts once the server has shown it runs it (its first
streamed event: before that it may still be in flight, or parsed but not yet queued) *and* a
scrape started after that; a call that ended is dropped at once (the server has freed it, or
will have by the next scrape, which is conservative either way). A call the last scrape
counted that has ended since gives its slot and KV back at once, until a scrape started after
its end lands: the dispatch loop refills a slot when the call in it ends, not a scrape interval
later (on a saturated CPU server a step is a few hundred milliseconds, the same order as the
scrape interval). Events are ordered by one counter, not by clock time, so a scrape and a call
on the same clock tick are still ordered. The booked calls count as waiting: sent, not yet seen
admitted. Pure: no I/O, no clock. Invariant: a call sent is subtracted from the room until a
scrape that started after the server showed it has landed, and never after it ended; a call
ended is added back only while the last landed scrape started before its end and counted it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends.base import BackendCapacity
from gateway.backends.server_load import ServerLoad

UNSHOWN = -1  # `shown_at` of a call whose first event has not come


@dataclass(slots=True)
class _Booked:
    prompt_tokens: int
    output_tokens: int  # predicted: with the prompt, the KV it will hold
    shown_at: int  # the event counter when its first event came; UNSHOWN before
    ended_at: int = 0  # the event counter when it ended, once a scrape had counted it

    def blocks(self, block_size: int) -> int:
        return -(-(self.prompt_tokens + self.output_tokens) // block_size)


class UnseenCalls:
    def __init__(self) -> None:
        self._tick = 0
        self._calls: dict[str, _Booked] = {}  # sent, not yet in a landed scrape
        self._counted: dict[str, _Booked] = {}  # running as far as the last scrape knows
        self._freed: dict[str, _Booked] = {}  # counted by the last scrape, ended since

    def _next(self) -> int:
        self._tick += 1
        return self._tick

    def sent(self, call_id: str, prompt_tokens: int, output_tokens: int) -> None:
        self._calls[call_id] = _Booked(prompt_tokens, output_tokens, UNSHOWN)

    def shown(self, call_id: str) -> None:
        """The server streamed the call's first event: it has it."""
        booked = self._calls.get(call_id)
        if booked is not None and booked.shown_at == UNSHOWN:
            booked.shown_at = self._next()

    def resized(self, call_id: str, output_tokens: int) -> None:
        """The call's output is predicted anew."""
        booked = self._calls.get(call_id) or self._counted.get(call_id)
        if booked is not None:
            booked.output_tokens = output_tokens

    def ended(self, call_id: str) -> None:
        if self._calls.pop(call_id, None) is not None:
            return
        counted = self._counted.pop(call_id, None)
        if counted is not None:
            counted.ended_at = self._next()
            self._freed[call_id] = counted

    def scrape_started(self) -> int:
        """A mark to hand to `scraped` when this scrape lands."""
        return self._next()

    def scraped(self, mark: int) -> None:
        """A scrape started at `mark` landed: it counts every call shown before it, and no
        longer those that ended before it."""
        for call_id in [c for c, b in self._calls.items() if UNSHOWN < b.shown_at < mark]:
            self._counted[call_id] = self._calls.pop(call_id)
        for call_id in [c for c, b in self._freed.items() if b.ended_at < mark]:
            del self._freed[call_id]

    def __len__(self) -> int:
        return len(self._calls)

    def capacity(self, load: ServerLoad, max_num_seqs: int, healthy: bool) -> BackendCapacity:
        """`load` less the booked calls, plus the counted calls that ended; free slots from
        `max_num_seqs` (servers do not export it)."""
        size = load.block_size
        booked_blocks = sum(b.blocks(size) for b in self._calls.values())
        freed_blocks = sum(b.blocks(size) for b in self._freed.values())
        free_blocks = min(load.free_blocks - booked_blocks + freed_blocks, load.num_blocks)
        running = max(load.running - len(self._freed), 0)
        waiting = load.waiting + len(self._calls)
        return BackendCapacity(
            free_blocks=max(free_blocks, 0),
            block_size=size,
            free_slots=max(max_num_seqs - running - waiting, 0),
            running=running,
            waiting=waiting,
            healthy=healthy,
            total_blocks=load.num_blocks,
        )
