from engine.block_manager import BlockManager
from engine.request import Request
from engine.sampling import SamplingParams
from tests.engine.factories import make_request, make_sim_engine


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
    hit = bm.find_cached_prefix(second)
    assert hit == first.block_ids[:2]
    assert bm.allocate_slots(second, 10, hit)
    assert second.block_ids[:2] == first.block_ids[:2]
    assert bm.blocks[hit[0]].ref_count == 2
    other = make_request("c", prompt_len=10)
    other.prompt_token_ids = list(first.prompt_token_ids)
    other.prompt_token_ids[5] += 1
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
    held = list(first.block_ids[:2])
    bm.free(first)
    assert bm.find_cached_prefix(first) == held
    filler = make_request("c", prompt_len=12)
    assert bm.allocate_slots(filler, 12)  # takes every block, evicting the cached ones
    assert bm.find_cached_prefix(first) == []
    bm.free(filler)
    bm.check_invariants()


def test_whole_prompt_hit_leaves_one_token_to_compute() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    first = make_request("a", prompt_len=8)
    assert bm.allocate_slots(first, 8)
    first.num_computed_tokens = 8
    bm.cache_full_blocks(first)
    assert len(bm.find_cached_prefix(first)) == 1


def grow(bm: BlockManager, req: Request, num_tokens: int) -> None:
    """Compute the request up to `num_tokens`, decoding output tokens past its prompt."""
    req.output_token_ids += [500 + i for i in range(req.num_tokens, num_tokens)]
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
    assert len(bm.find_cached_prefix(first)) == 2
    grow(bm, filler, 12)  # evicts the least recently freed block: first's tail
    assert len(bm.find_cached_prefix(first)) == 1
    assert len(bm.find_cached_prefix(second)) == 2
    bm.free(filler)
    bm.check_invariants()


def cached(bm: BlockManager, rid: str, prompt: list[int], salt: str = "") -> Request:
    """A request whose whole prompt is computed and cached in `bm`."""
    req = Request(rid, prompt, SamplingParams(max_tokens=1), arrival_time=0.0, cache_salt=salt)
    assert bm.allocate_slots(req, len(prompt), bm.find_cached_prefix(req))
    grow(bm, req, len(prompt))
    return req


def test_same_prompt_and_salt_share_blocks() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(1, 10))
    first = cached(bm, "a", prompt, salt="acme")
    second = cached(bm, "b", prompt, salt="acme")
    assert second.block_ids[:2] == first.block_ids[:2]
    assert bm.blocks[first.block_ids[0]].ref_count == 2
    bm.check_invariants()


def test_different_salts_never_share_blocks() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(1, 10))
    acme = cached(bm, "a", prompt, salt="acme")
    globex = cached(bm, "b", prompt, salt="globex")
    unsalted = cached(bm, "c", prompt)
    assert not set(acme.block_ids) & set(globex.block_ids)
    assert not set(unsalted.block_ids) & (set(acme.block_ids) | set(globex.block_ids))
    for req in (acme, globex, unsalted):  # each salt still finds its own blocks
        probe = Request("p", prompt, req.params, arrival_time=0.0, cache_salt=req.cache_salt)
        assert bm.find_cached_prefix(probe) == req.block_ids[:2]
    bm.check_invariants()


def test_equal_blocks_under_different_prefixes_are_never_shared() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    head_a, head_b, same = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    a = cached(bm, "a", [*head_a, *same, 99])
    cached(bm, "c", [*head_b, 13, 14, 15, 16, 99])  # so b's first block is a hit
    b = Request("b", [*head_b, *same, 99], a.params, arrival_time=0.0)
    hit = bm.find_cached_prefix(b)
    assert len(hit) == 1 and a.block_ids[1] not in hit
    assert bm.allocate_slots(b, b.num_tokens, hit)
    grow(bm, b, b.num_tokens)
    block_a, block_b = bm.blocks[a.block_ids[1]], bm.blocks[b.block_ids[1]]
    assert block_a.block_id != block_b.block_id and block_a.token_bytes == block_b.token_bytes
    assert block_a.key is not None and block_b.key is not None and block_a.key != block_b.key
    bm.check_invariants()


def test_cache_salt_reaches_the_block_manager_through_the_engine() -> None:
    llm = make_sim_engine(num_blocks=64)
    prompt = list(range(1, 30))
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    llm.generate([prompt], params)
    requests = {}
    for rid, salt in (("same", ""), ("other", "globex")):
        llm.add_request(prompt, params, request_id=rid, cache_salt=salt)
        llm.step()
        requests[rid] = llm.request(rid)
    assert requests["same"].num_cached_tokens == 28
    assert requests["other"].num_cached_tokens == 0
