"""KV block pool: ref-counted fixed-size blocks, a free pool, and a prefix cache.

A request's KV lives in `request.block_ids`, `block_size` tokens per block. Full blocks are
keyed by a chained BLAKE2b digest: a block's key is the hash of its parent's key (fixed length)
and its token ids (fixed-width little-endian), and the first block's parent is the hash of the
request's cache salt. So a key commits to the salt and to every token before the block's end,
an attacker cannot craft a collision to be handed KV computed under another prefix, and requests
with different salts never share a block. Two requests with the same salt and prefix share the
same blocks; a hit is also confirmed by comparing the block's own tokens.
Freed blocks keep their key and wait in the free pool (`FreePool`: evicted only when no clean
block is left, least recently freed first), so a later request can revive them until then. New
blocks come from the pool in runs of consecutive ids, sized by the tokens the request expects
(prompt + max_tokens, or + the predicted output length when it has one).

Invariants: every block is either free (ref_count == 0, in the free pool) or used
(ref_count > 0, not in the free pool); `num_free_blocks + num_used_blocks == num_blocks`.
The manager answers "fits?"; it never picks a victim.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from engine.free_pool import FreePool
from engine.request import Request

BlockHash = bytes  # DIGEST_SIZE bytes, committing to the salt and the whole prefix
DIGEST_SIZE = 32
TOKEN_ID_LIMIT = 1 << 64  # token ids are encoded as unsigned 64-bit integers
# Personalised (domain-separated) so a salt root is never a block's key; only ever copied,
# which is cheaper than building a hasher per block.
_ROOT_HASHER = hashlib.blake2b(digest_size=DIGEST_SIZE, person=b"fairgate-salt")
_BLOCK_HASHER = hashlib.blake2b(digest_size=DIGEST_SIZE, person=b"fairgate-block")


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    key: BlockHash | None = None
    token_bytes: bytes = b""  # the keyed tokens, packed: a hit is confirmed against them


def root_hash(cache_salt: str) -> BlockHash:
    """The parent of a request's first block: only requests with equal salts share blocks."""
    hasher = _ROOT_HASHER.copy()
    hasher.update(cache_salt.encode())
    return hasher.digest()


def block_hash(parent: BlockHash, token_bytes: bytes) -> BlockHash:
    """A full block's key from its parent's key and its packed token ids."""
    hasher = _BLOCK_HASHER.copy()
    hasher.update(parent + token_bytes)
    return hasher.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free = FreePool(num_blocks)
        self._cached: dict[BlockHash, int] = {}
        self._tails: dict[str, int] = {}  # request id -> last block, whose room it claimed
        self._num_hashed: dict[str, int] = {}  # request id -> leading blocks already keyed
        self._last_key: dict[str, BlockHash] = {}  # request id -> key of its last keyed block
        self._pack = struct.Struct(f"<{block_size}Q").pack  # one full block's token ids

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

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids holding the longest cached prefix of the request's full blocks.

        Never the whole sequence: at least one token is left to compute, so the step that
        finishes the prompt still produces logits.
        """
        if not self.enable_prefix_cache:
            return []
        found: list[int] = []
        num_full = (request.num_tokens - 1) // self.block_size
        for key, packed in self._chain(request, 0, num_full, root_hash(request.cache_salt)):
            block_id = self._cached.get(key)
            if block_id is None or self.blocks[block_id].token_bytes != packed:
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
        start = self._num_hashed.get(rid, 0)
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= start:
            return
        parent = self._last_key.get(rid) or root_hash(request.cache_salt)
        chain = self._chain(request, start, num_full, parent)
        for block_id, (key, packed) in zip(request.block_ids[start:num_full], chain, strict=True):
            block = self.blocks[block_id]
            if block.key is None and key not in self._cached:
                block.key, block.token_bytes = key, packed
                self._cached[key] = block_id
        self._num_hashed[rid] = num_full
        self._last_key[rid] = key

    def _chain(
        self, request: Request, start: int, stop: int, parent: BlockHash
    ) -> Iterator[tuple[BlockHash, bytes]]:
        """(key, packed tokens) of the request's full blocks [start, stop), `parent` the key
        of the block before `start`."""
        size = self.block_size
        key = parent
        for index in range(start, stop):
            packed = self._pack(*request.token_slice(index * size, (index + 1) * size))
            key = block_hash(key, packed)
            yield key, packed

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
        self._last_key.pop(request.request_id, None)

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
                block.token_bytes = b""
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
