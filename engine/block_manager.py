"""KV block pool: ref-counted fixed-size blocks, a free pool, and a prefix cache.

A request's KV lives in `request.block_ids`, `block_size` tokens per block. Full blocks are
keyed by a chained hash (hash of the previous block's key and this block's tokens), so two
requests with the same prefix share the same blocks; a hit is confirmed by comparing tokens.
Freed blocks keep their key and wait in the free pool (`FreePool`: evicted only when no clean
block is left, least recently freed first), so a later request can revive them until then. New
blocks come from the pool in runs of consecutive ids, sized by the tokens the request expects
(prompt + max_tokens, or + the predicted output length when it has one).

Invariants: every block is either free (ref_count == 0, in the free pool) or used
(ref_count > 0, not in the free pool); `num_free_blocks + num_used_blocks == num_blocks`.
The manager answers "fits?"; it never picks a victim.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.free_pool import FreePool
from engine.request import Request

BlockKey = tuple[int, int]  # (chained hash, block index): index keeps equal hashes of
# different depths apart


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    key: BlockKey | None = None
    token_ids: tuple[int, ...] = ()


def chain_hash(prev: int, token_ids: tuple[int, ...]) -> int:
    return hash((prev, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free = FreePool(num_blocks)
        self._cached: dict[BlockKey, int] = {}
        self._tails: dict[str, int] = {}  # request id -> last block, whose room it claimed
        self._num_hashed: dict[str, int] = {}  # request id -> leading blocks already keyed
        self._hashes: dict[str, list[int]] = {}  # request id -> chained hash per full block

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def find_cached_prefix(self, token_ids: list[int]) -> list[int]:
        """Block ids holding the longest cached prefix of full blocks.

        Never the whole sequence: at least one token is left to compute, so the step that
        finishes the prompt still produces logits.
        """
        if not self.enable_prefix_cache:
            return []
        found: list[int] = []
        prev = 0
        for index in range((len(token_ids) - 1) // self.block_size):
            chunk = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            prev = chain_hash(prev, chunk)
            block_id = self._cached.get((prev, index))
            if block_id is None or self.blocks[block_id].token_ids != chunk:
                break
            found.append(block_id)
        return found

    def allocate_slots(
        self, request: Request, num_tokens: int, cached_block_ids: list[int] | None = None
    ) -> bool:
        """Make `request.block_ids` cover `num_tokens` tokens, reusing `cached_block_ids` first.

        Returns False, changing nothing, when the free list cannot cover it.
        """
        cached = cached_block_ids or []
        num_new = self.blocks_for(num_tokens) - len(request.block_ids) - len(cached)
        revived = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        if num_new + revived > len(self._free):
            return False
        for block_id in cached:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self._free.revive(block_id)
            block.ref_count += 1
            request.block_ids.append(block_id)
        if num_new > 0:
            self._take_free_blocks(request, num_new)
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Key the request's newly full, computed blocks so later requests can share them."""
        if not self.enable_prefix_cache:
            return
        rid = request.request_id
        hashes = self._hashes.setdefault(rid, [])
        start = self._num_hashed.get(rid, 0)
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= start:
            return
        prev = hashes[-1] if hashes else 0
        size = self.block_size
        for index in range(start, num_full):
            chunk = tuple(request.token_slice(index * size, (index + 1) * size))
            prev = chain_hash(prev, chunk)
            hashes.append(prev)
            block = self.blocks[request.block_ids[index]]
            if block.key is None and (prev, index) not in self._cached:
                block.key = (prev, index)
                block.token_ids = chunk
                self._cached[block.key] = block.block_id
        self._num_hashed[rid] = num_full

    def free(self, request: Request) -> None:
        """Drop the request's hold on its blocks; tail blocks are evicted before shared heads."""
        tail = self._tails.pop(request.request_id, None)
        if tail is not None:
            self._free.unclaim(tail)
        for block_id in reversed(request.block_ids):
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} freed twice"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free.release(block_id, cached=block.key is not None)
        request.block_ids = []
        self._num_hashed.pop(request.request_id, None)
        self._hashes.pop(request.request_id, None)

    def _take_free_blocks(self, request: Request, count: int) -> None:
        """Append `count` new blocks to the request, continuing its run of ids where it can."""
        rid = request.request_id
        tail = self._tails.pop(rid, None)
        if tail is not None:
            self._free.unclaim(tail)
        room = max(self.blocks_for(_expected_tokens(request)) - len(request.block_ids), count)
        after = request.block_ids[-1] if request.block_ids else None
        for block_id in self._free.take(count, after, room):
            block = self.blocks[block_id]
            if block.key is not None:  # evicted from the prefix cache
                del self._cached[block.key]
                block.key = None
                block.token_ids = ()
            block.ref_count = 1
            request.block_ids.append(block_id)
        if room > count:
            self._tails[rid] = request.block_ids[-1]
            self._free.claim(request.block_ids[-1], room - count)

    def check_invariants(self) -> None:
        """Raise AssertionError when the pool is inconsistent (used by tests)."""
        used = {b.block_id for b in self.blocks if b.ref_count != 0}
        self._free.check_invariants(used)
        for block in self.blocks:
            assert block.ref_count >= 0, f"negative ref count on block {block.block_id}"
            if block.key is not None:
                assert self._cached[block.key] == block.block_id
        assert set(self._tails.values()) <= used
        assert len(self._free) + len(used) == self.num_blocks


def _expected_tokens(request: Request) -> int:
    """Tokens the request is expected to reach: its prompt plus max_tokens or the prediction."""
    output = request.params.max_tokens
    if request.predicted_output_len is not None:
        output = min(output, request.predicted_output_len)
    return request.num_prompt_tokens + output
