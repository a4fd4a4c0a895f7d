"""Seeded blast: thousands of random add / step / abort operations on the real scheduler and
block manager (simulated runner), with the pool's invariants checked after every operation."""

import random

from engine.config import ReserveMode
from engine.request import RequestStatus
from engine.sampling import SamplingParams
from tests.engine.factories import make_sim_engine


def test_blast_never_leaks_blocks() -> None:
    for mode in ReserveMode:
        rng = random.Random(1234)
        llm = make_sim_engine(num_blocks=48, max_num_batched_tokens=32, reserve_mode=mode)
        bm = llm.block_manager
        live: list[str] = []
        shared_prefix = [rng.randrange(1, 500) for _ in range(12)]
        for _ in range(3000):
            op = rng.random()
            if op < 0.25:
                n = rng.randint(1, 40)
                prompt = shared_prefix[: rng.randint(0, 12)] + [
                    rng.randrange(1, 500) for _ in range(n)
                ]
                params = SamplingParams(max_tokens=rng.randint(1, 30), ignore_eos=True)
                live.append(
                    llm.add_request(prompt, params, predicted_output_len=rng.randint(1, 30))
                )
            elif op < 0.35 and live:
                rid = live.pop(rng.randrange(len(live)))
                if rid in llm.scheduler.requests:
                    llm.abort(rid)
            else:
                llm.step()
            bm.check_invariants()
            held = sum(len(r.block_ids) for r in llm.scheduler.running)
            assert all(not r.block_ids for r in llm.scheduler.waiting)
            assert held == sum(b.ref_count for b in bm.blocks)
            for r in llm.scheduler.running:
                assert r.status is RequestStatus.RUNNING
                assert len(r.block_ids) * bm.block_size >= r.num_computed_tokens
        while llm.has_unfinished:
            llm.step()
            bm.check_invariants()
        assert bm.num_free_blocks == bm.num_blocks
        assert all(b.ref_count == 0 for b in bm.blocks)
