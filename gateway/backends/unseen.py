"""Room on a remote backend: its last scrape, less the calls it had not shown when scraped.

A server's metrics lag the gateway: a call sent a moment ago is in nobody's scrape yet. So each
call sent is booked here with its slot and its KV (prompt plus predicted output, in blocks) until
a scrape is known to count it. A call counts once the server has shown it runs it (its first
streamed event: before that it may still be in flight, or parsed but not yet queued) *and* a
scrape started after that; a call that ended is dropped at once (the server has freed it, or
will have by the next scrape, which is conservative either way). Events are ordered by one
counter, not by clock time, so a scrape and a call on the same clock tick are still ordered.
The booked calls count as waiting: sent, not yet seen admitted. Pure: no I/O, no clock.
Invariant: a call sent is subtracted from the room until a scrape that started after the server
showed it has landed, and never after it ended.
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


class UnseenCalls:
    def __init__(self) -> None:
        self._tick = 0
        self._calls: dict[str, _Booked] = {}

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
        booked = self._calls.get(call_id)
        if booked is not None:
            booked.output_tokens = output_tokens

    def ended(self, call_id: str) -> None:
        self._calls.pop(call_id, None)

    def scrape_started(self) -> int:
        """A mark to hand to `scraped` when this scrape lands."""
        return self._next()

    def scraped(self, mark: int) -> None:
        """A scrape started at `mark` landed: it counts every call shown before it."""
        for call_id in [c for c, b in self._calls.items() if UNSHOWN < b.shown_at < mark]:
            del self._calls[call_id]

    def __len__(self) -> int:
        return len(self._calls)

    def capacity(self, load: ServerLoad, max_num_seqs: int, healthy: bool) -> BackendCapacity:
        """`load` less the booked calls; free slots from `max_num_seqs` (servers do not export
        it)."""
        booked_blocks = sum(
            -(-(b.prompt_tokens + b.output_tokens) // load.block_size) for b in self._calls.values()
        )
        waiting = load.waiting + len(self._calls)
        return BackendCapacity(
            free_blocks=max(load.free_blocks - booked_blocks, 0),
            block_size=load.block_size,
            free_slots=max(max_num_seqs - load.running - waiting, 0),
            running=load.running,
            waiting=waiting,
            healthy=healthy,
            total_blocks=load.num_blocks,
        )
