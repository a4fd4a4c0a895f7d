"""Room on a remote backend: its last scrape less the gateway's own calls in it, plus those now.

A server's metrics lag the gateway (vLLM updates its gauges once a step; a call sent a moment
ago is in nobody's scrape yet), and a scrape does not say which of the requests it counts are
the gateway's. So the room is split by who holds it. The gateway knows its own calls exactly:
those sent and not ended, each with its slot and its KV in blocks: what it holds on the server
(its prompt and the tokens streamed so far) and what it may grow to (its prompt and the larger of
its predicted and streamed output). The rest of a scrape is other clients' (replicas of this
gateway, or anyone else): what it counted beyond the gateway's calls open when it started, as
they were then (a call that ended since still counted there). A server only this gateway sends to
thus leaves exactly the slots its calls do not hold, however far its gauges lag, and the KV they
may not grow to (to a block or so a call: below); one shared with others leaves theirs as of
the last scrape, and this gateway's as they are now.

A call of the gateway's still on its way to the server when a scrape started is taken to be in
it: if it was not, the others' part is short by that call until the next scrape lands (one
slot too many, for a scrape interval at most). Counting each call of the gateway's until a
scrape was sure to have it (its first event, then a scrape after that) would instead hold its
slot twice for as long as the server takes to show it, its queueing and prefill: on a saturated
CPU server, a second or more of every call. KV the same way, as the server holds it: the others'
part of the used blocks is the used blocks less what the gateway's calls held when the scrape
started (never below zero). Their predicted size instead would count its gap to what they hold
as free room, where other clients' calls may be. What they make between the scrape's start and
the server's gauge goes to the others' part (or from it, a gauge older than the start) until the
next scrape: a block or so per call. Pure: no I/O, no clock.
Invariant: free slots = `max_num_seqs` − others' calls − the gateway's open calls, never below
zero; free blocks = the server's − others' blocks − what the gateway's open calls may grow to,
never below zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.backends.base import BackendCapacity, blocks
from gateway.backends.server_load import ServerLoad


@dataclass(slots=True)
class _Call:
    prompt_tokens: int
    output_tokens: int  # predicted
    streamed: int = 0  # output tokens the server has sent so far

    @property
    def tokens(self) -> int:
        """The KV it may grow to: what the gateway holds for it."""
        return self.prompt_tokens + max(self.output_tokens, self.streamed)

    @property
    def held(self) -> int:
        """The KV it holds on the server now (what a scrape counts)."""
        return self.prompt_tokens + self.streamed


class OwnCalls:
    def __init__(self) -> None:
        self._calls: dict[str, _Call] = {}  # sent, not ended
        # what each call open when the last landed scrape started held then, in tokens: what
        # that scrape counts of the gateway's
        self._in_scrape: tuple[int, ...] = ()
        # the blocks of both at the block size the room was last asked at, kept as calls come
        # and go: a server running hundreds of the gateway's calls is asked for its room on
        # every dispatch, and summing them each time would make that O(calls)
        self._size = 0  # not asked yet: no blocks kept
        self._own_blocks = 0
        self._marked_blocks = 0

    def _blocks(self, tokens: int) -> int:
        return blocks(tokens, self._size) if self._size else 0

    def sent(self, call_id: str, prompt_tokens: int, output_tokens: int) -> None:
        self.ended(call_id)
        call = self._calls[call_id] = _Call(prompt_tokens, output_tokens)
        self._own_blocks += self._blocks(call.tokens)

    def resized(self, call_id: str, output_tokens: int) -> None:
        """The call's output is predicted anew."""
        if (call := self._calls.get(call_id)) is not None:
            with self._recounted(call):
                call.output_tokens = output_tokens

    def streamed(self, call_id: str, output_tokens: int) -> None:
        """The server has sent the call's first `output_tokens` tokens."""
        if (call := self._calls.get(call_id)) is not None:
            with self._recounted(call):
                call.streamed = output_tokens

    @contextlib.contextmanager
    def _recounted(self, call: _Call) -> Iterator[None]:
        """The blocks the gateway holds for an open call, counted again after the block changed
        it."""
        self._own_blocks -= self._blocks(call.tokens)
        yield
        self._own_blocks += self._blocks(call.tokens)

    def ended(self, call_id: str) -> None:
        call = self._calls.pop(call_id, None)
        if call is not None:
            self._own_blocks -= self._blocks(call.tokens)

    def scrape_started(self) -> tuple[int, ...]:
        """A mark to hand to `scraped` when this scrape lands: the calls it may count."""
        return tuple(c.held for c in self._calls.values())

    def scraped(self, mark: tuple[int, ...]) -> None:
        """The scrape that started at `mark` landed: its load is the server's now."""
        self._in_scrape = mark
        self._marked_blocks = sum(self._blocks(t) for t in mark)

    def __len__(self) -> int:
        return len(self._calls)

    def _at_block_size(self, size: int) -> None:
        if size != self._size:
            self._size = size
            self._own_blocks = sum(self._blocks(c.tokens) for c in self._calls.values())
            self._marked_blocks = sum(self._blocks(t) for t in self._in_scrape)

    def capacity(self, load: ServerLoad, max_num_seqs: int, healthy: bool) -> BackendCapacity:
        """`load` less the gateway's calls it may count (the others' part), less the gateway's
        calls now; free slots from `max_num_seqs` (servers do not export it)."""
        self._at_block_size(load.block_size)
        others_blocks = max(load.used_blocks - self._marked_blocks, 0)
        others = max(load.running + load.waiting - len(self._in_scrape), 0)
        held = others + len(self._calls)
        running = min(load.running, held)
        return BackendCapacity(
            free_blocks=max(load.num_blocks - others_blocks - self._own_blocks, 0),
            block_size=load.block_size,
            free_slots=max(max_num_seqs - held, 0),
            running=running,
            waiting=held - running,
            healthy=healthy,
            total_blocks=load.num_blocks,
        )
