from engine.block_manager import BlockManager
from engine.request import Request
from tests.engine.factories import make_request


def test_allocate_and_free_returns_every_block() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    req = make_request("a", prompt_len=10)
    assert bm.allocate_slots(req, 10)
    assert len(req.block_ids) == 3 and bm.num_free_blocks == 1
    bm.free(req)
    assert req.block_ids == [] and bm.num_free_blocks == 4
    bm.check_invariants()


def test_allocation_that_does_not_fit_changes_nothing() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    req = make_request("a", prompt_len=10)
    assert not bm.allocate_slots(req, 10)
    assert req.block_ids == [] and bm.num_free_blocks == 2


def test_prefix_cache_shares_full_blocks_and_checks_tokens() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    first = make_request("a", prompt_len=10)
    assert bm.allocate_slots(first, 10)
    first.num_computed_tokens = 10
    bm.cache_full_blocks(first)
    second = make_request("b", prompt_len=10)
    second.prompt_token_ids = list(first.prompt_token_ids)
    hit = bm.find_cached_prefix(second.prompt_token_ids)
    assert hit == first.block_ids[:2]
    assert bm.allocate_slots(second, 10, hit)
    assert second.block_ids[:2] == first.block_ids[:2]
    assert bm.blocks[hit[0]].ref_count == 2
    other = list(first.prompt_token_ids)
    other[5] += 1
    assert bm.find_cached_prefix(other) == first.block_ids[:1]
    bm.free(first)
    bm.free(second)
    assert bm.num_free_blocks == 8
    bm.check_invariants()


def test_freed_cached_blocks_revive_until_reused() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    first = make_request("a", prompt_len=9)
    assert bm.allocate_slots(first, 9)
    first.num_computed_tokens = 9
    bm.cache_full_blocks(first)
    tokens = list(first.prompt_token_ids)
    held = list(first.block_ids[:2])
    bm.free(first)
    assert bm.find_cached_prefix(tokens) == held
    filler = make_request("c", prompt_len=12)
    assert bm.allocate_slots(filler, 12)  # takes every block, evicting the cached ones
    assert bm.find_cached_prefix(tokens) == []
    bm.free(filler)
    bm.check_invariants()


def test_whole_prompt_hit_leaves_one_token_to_compute() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    first = make_request("a", prompt_len=8)
    assert bm.allocate_slots(first, 8)
    first.num_computed_tokens = 8
    bm.cache_full_blocks(first)
    assert len(bm.find_cached_prefix(first.prompt_token_ids)) == 1


def grow(bm: BlockManager, req: Request, num_tokens: int) -> None:
    assert bm.allocate_slots(req, num_tokens)
    req.num_computed_tokens = num_tokens
    bm.cache_full_blocks(req)


def test_requests_growing_together_keep_runs_of_consecutive_blocks() -> None:
    bm = BlockManager(num_blocks=32, block_size=4)
    a = make_request("a", prompt_len=4, max_tokens=20)  # expects 6 blocks
    b = make_request("b", prompt_len=4, max_tokens=20)
    grow(bm, a, 4)
    grow(bm, b, 4)
    for num_tokens in range(5, 25):
        grow(bm, a, num_tokens)
        grow(bm, b, num_tokens)
        bm.check_invariants()
    for req in (a, b):
        assert req.block_ids == list(range(req.block_ids[0], req.block_ids[0] + 6))


def test_a_new_run_halves_the_largest_claimed_room_when_none_is_free() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_request("a", prompt_len=4, max_tokens=28)  # expects the whole pool
    grow(bm, a, 4)
    b = make_request("b", prompt_len=4)
    grow(bm, b, 4)
    assert a.block_ids == [0] and b.block_ids == [4]
    bm.check_invariants()


def test_cached_blocks_are_evicted_only_when_no_clean_block_is_left() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    first, second = make_request("a", prompt_len=9), make_request("bb", prompt_len=9)
    for req in (first, second):
        grow(bm, req, 9)
    bm.free(first)  # 2 cached blocks + 1 clean
    bm.free(second)  # freed later: evicted later
    filler = make_request("c", prompt_len=8)
    grow(bm, filler, 8)  # the 2 clean blocks: nothing evicted
    assert len(bm.find_cached_prefix(first.prompt_token_ids)) == 2
    grow(bm, filler, 12)  # evicts the least recently freed block: first's tail
    assert len(bm.find_cached_prefix(first.prompt_token_ids)) == 1
    assert len(bm.find_cached_prefix(second.prompt_token_ids)) == 2
    bm.free(filler)
    bm.check_invariants()
