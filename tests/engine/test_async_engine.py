import anyio
import pytest

from engine.async_engine import AsyncEngine
from engine.errors import InvalidRequest
from engine.llm import LLMEngine
from engine.request import FinishReason
from engine.sampling import SamplingParams
from tests.engine.factories import make_sim_engine

pytestmark = pytest.mark.anyio


async def until_idle(core: LLMEngine) -> None:
    """Wait (bounded) for the step in flight to end and the engine to have nothing left."""
    with anyio.fail_after(5):
        while core.has_unfinished:
            await anyio.sleep(0.001)


async def test_two_hundred_concurrent_streams_all_finish() -> None:
    core = make_sim_engine(num_blocks=4096, max_num_seqs=256, max_num_batched_tokens=4096)
    results: dict[int, list[int]] = {}

    async def consume(i: int) -> None:
        stream = engine.add_request(
            [1 + i % 50] * (5 + i % 7), SamplingParams(max_tokens=3 + i % 5)
        )
        tokens: list[int] = []
        async for delta in stream:
            tokens += delta.token_ids
            if delta.finished:
                assert delta.finish_reason is FinishReason.LENGTH
        results[i] = tokens

    async with AsyncEngine(core) as engine, anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(consume, i)
    assert sorted(results) == list(range(200))
    assert all(len(results[i]) == 3 + i % 5 for i in range(200))
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


async def test_abort_frees_blocks_and_ends_the_stream() -> None:
    core = make_sim_engine(num_blocks=64)
    async with AsyncEngine(core) as engine:
        stream = engine.add_request(list(range(1, 20)), SamplingParams(max_tokens=500))
        seen = 0
        async for delta in stream:
            seen += len(delta.token_ids)
            if seen == 3:
                engine.abort(stream.request_id)
        assert seen == 3
        await until_idle(core)  # applied at the end of the step in flight, if any
        assert core.block_manager.num_free_blocks == 64


async def test_closing_a_stream_early_aborts_its_request() -> None:
    core = make_sim_engine(num_blocks=64)
    async with AsyncEngine(core) as engine:
        stream = engine.add_request(list(range(1, 20)), SamplingParams(max_tokens=500))
        async for _ in stream:
            break
        await stream.aclose()
        assert engine.num_live == 0
        await until_idle(core)
    assert core.block_manager.num_free_blocks == 64 and not core.has_unfinished


async def test_invalid_request_is_refused_synchronously() -> None:
    core = make_sim_engine(num_blocks=64)
    async with AsyncEngine(core) as engine:
        with pytest.raises(InvalidRequest):
            engine.add_request([], SamplingParams(max_tokens=4))


async def test_has_room_counts_waiting_and_pending_requests() -> None:
    core = make_sim_engine(num_blocks=8)  # block_size 4: 32 tokens of KV
    async with AsyncEngine(core) as engine:
        assert engine.has_room(32)
        async with engine.add_request(list(range(1, 17)), SamplingParams(max_tokens=4)):
            assert not engine.has_room(32)
            assert engine.has_room(16)
