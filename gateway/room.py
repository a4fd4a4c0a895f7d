"""Room in the engine for one more call, counting the KV that waiting calls will reserve.

The engine's capacity counts a waiting request by its tokens so far, but admitting it sets aside
its prompt plus its predicted output. The dispatch loop (and the simulator that mirrors it) keeps
the calls it has handed to the engine that the engine has not admitted yet, with the blocks
their outputs will add, and takes those off the free blocks: a burst of dispatches between two
engine steps cannot promise the same blocks twice. A call leaves the set when the engine admits
it (its reservation is then in the engine's own count) or when it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from engine import Capacity, Request, RequestStatus


class WaitingCalls:
    def __init__(self, blocks_for: Callable[[int], int]) -> None:
        self._blocks_for = blocks_for
        self._extra: dict[str, int] = {}  # call id -> blocks its output reservation adds
        self.blocks = 0  # their sum

    def add(self, call_id: str, prompt_tokens: int, reserve_output: int) -> None:
        extra = self._blocks_for(prompt_tokens + reserve_output) - self._blocks_for(prompt_tokens)
        self._extra[call_id] = extra
        self.blocks += extra

    def discard(self, call_id: str) -> None:
        self.blocks -= self._extra.pop(call_id, 0)

    def prune(self, requests: Mapping[str, Request]) -> None:
        """Forget the calls the engine has admitted. `requests` is the scheduler's; a call not in
        it yet is an add deferred past the step in flight, so it still waits."""
        admitted = [
            call_id
            for call_id in self._extra
            if (request := requests.get(call_id)) is not None
            and request.status is not RequestStatus.WAITING
        ]
        for call_id in admitted:
            self.discard(call_id)

    def __len__(self) -> int:
        return len(self._extra)


def has_room(
    capacity: Capacity, blocks_for: Callable[[int], int], num_tokens: int, waiting: int
) -> bool:
    """Would a call needing `num_tokens` of KV be admitted at once, `waiting` blocks being
    promised to calls the engine has yet to admit?"""
    return capacity.free_seqs > 0 and capacity.free_blocks - waiting >= blocks_for(num_tokens)
