"""The KV pool's free blocks, and which ones to hand out so a request's blocks stay in runs.

Free blocks are of two kinds. Clean ones (holding nothing reusable) are kept as maximal runs of
consecutive ids. Cached ones still hold a prefix-cache entry: they wait in least-recently-freed
order and are evicted (handed out again) only when no clean block is left, oldest first, so a
later request can revive them by hash until then.

Locality: a request's KV reads are fastest when its blocks are consecutive ids (the paged-attention
kernel then streams its pages as one run instead of hopping between other requests' blocks). So a
request grows into the block right after its last one while that is clean, and otherwise starts a
new run where there is room for the blocks it still expects (its "room"). A request's room past
its last block is claimed, so a new run starts after it; the first run found with enough unclaimed
room wins, and when none has enough, the one leaving the most room, split at most halfway into a
claim.
Invariant: clean runs are disjoint and never adjacent, no block is both clean and cached, and
`len(pool)` counts every free block once.
"""

from __future__ import annotations

from collections import OrderedDict


class FreePool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._run_end: dict[int, int] = {0: num_blocks}  # clean run start -> end (exclusive)
        self._run_start: dict[int, int] = {num_blocks: 0}  # clean run end -> start
        self.num_clean = num_blocks
        self._cached: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self._claims: dict[int, int] = {}  # a request's last block -> end of the room it expects

    def __len__(self) -> int:
        return self.num_clean + len(self._cached)

    def release(self, block_id: int, cached: bool) -> None:
        """Return a block whose last holder let go; a cached one keeps its entry until evicted."""
        if cached:
            self._cached[block_id] = None
            return
        start, end = block_id, block_id + 1
        if start in self._run_start:  # coalesce with the run ending here
            start = self._run_start.pop(start)
        if end in self._run_end:  # and with the run starting right after
            end = self._run_end.pop(end)
            del self._run_start[end]
        self._run_end[start], self._run_start[end] = end, start
        self.num_clean += 1

    def revive(self, block_id: int) -> None:
        """Take back a free cached block found by hash (a prefix-cache hit)."""
        del self._cached[block_id]

    def claim(self, last_block: int, room: int) -> None:
        """The request ending at `last_block` expects `room` more blocks right after it."""
        if room > 0:
            self._claims[last_block] = last_block + 1 + room

    def unclaim(self, last_block: int) -> None:
        self._claims.pop(last_block, None)

    def take(self, count: int, after: int | None, room: int) -> list[int]:
        """`count` free block ids for a request whose last block is `after`, expecting `room`.

        The caller has checked `count <= len(self)` and dropped its own claim; a returned block
        that was cached still carries its entry, for the caller to drop.
        """
        taken: list[int] = []
        nxt = None if after is None or after in self._claims else after + 1
        while len(taken) < count:
            if not self.num_clean:
                taken.append(self._cached.popitem(last=False)[0])
                continue
            if nxt is not None and nxt in self._run_end:
                run = nxt  # the block after the request's last one starts a clean run
            else:
                run, nxt = self._place(room - len(taken))
            self._split(run, nxt)
            taken.append(nxt)
            nxt += 1
        return taken

    def _place(self, want: int) -> tuple[int, int]:
        """(run start, block) where a run of `want` new blocks had best begin."""
        best, best_room = (-1, -1), -1
        for start, end in self._run_end.items():
            unclaimed = min(max(self._claims.get(start - 1, start), start), end)
            if end - unclaimed >= want:
                return start, unclaimed
            at = min(unclaimed, start + (end - start) // 2)
            if end - at > best_room:
                best, best_room = (start, at), end - at
        return best

    def _split(self, start: int, block_id: int) -> None:
        """Remove `block_id` from the clean run beginning at `start`."""
        end = self._run_end.pop(start)
        del self._run_start[end]
        if start < block_id:
            self._run_end[start], self._run_start[block_id] = block_id, start
        if block_id + 1 < end:
            self._run_end[block_id + 1], self._run_start[end] = end, block_id + 1
        self.num_clean -= 1

    def check_invariants(self, used: set[int]) -> None:
        """Raise AssertionError when the pool is inconsistent (used by tests)."""
        clean = {b for start, end in self._run_end.items() for b in range(start, end)}
        assert len(clean) == self.num_clean == sum(e - s for s, e in self._run_end.items())
        assert all(self._run_start[e] == s for s, e in self._run_end.items())
        assert len(self._run_start) == len(self._run_end)
        assert not any(e in self._run_end for e in self._run_start), "adjacent runs not merged"
        assert not clean & set(self._cached) and not (clean | set(self._cached)) & used
        assert set(self._claims) <= used
