import logging
import threading

import anyio
import pytest

from engine.async_engine import AsyncEngine, RequestStream, TokenDelta
from engine.config import EngineConfig
from engine.errors import InvalidRequest
from engine.llm import LLMEngine
from engine.plan import StepOutput, StepPlan
from engine.request import FinishReason
from engine.sampling import SamplingParams
from engine.scheduler import StepResult
from engine.sim_runner import SimulatedRunner
from engine.step_fit import knee_calls
from tests.engine.factories import STEP_MODEL, make_flaky_engine, make_sim_engine

pytestmark = pytest.mark.anyio


async def until_idle(engine: AsyncEngine) -> None:
    """Wait (bounded) for the step in flight to end and the engine to have nothing left."""
    with anyio.fail_after(5):
        await engine.wait_idle()
    assert not engine.core.has_unfinished


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
        await until_idle(engine)  # applied at the end of the step in flight, if any
        assert core.block_manager.num_free_blocks == 64


async def test_closing_a_stream_early_aborts_its_request() -> None:
    core = make_sim_engine(num_blocks=64)
    async with AsyncEngine(core) as engine:
        stream = engine.add_request(list(range(1, 20)), SamplingParams(max_tokens=500))
        async for _ in stream:
            break
        await stream.aclose()
        assert engine.num_live == 0
        await until_idle(engine)
    assert core.block_manager.num_free_blocks == 64 and not core.has_unfinished


async def test_invalid_request_is_refused_synchronously() -> None:
    core = make_sim_engine(num_blocks=64)
    async with AsyncEngine(core) as engine:
        with pytest.raises(InvalidRequest):
            engine.add_request([], SamplingParams(max_tokens=4))


async def test_capacity_counts_a_waiting_request_with_its_predicted_output() -> None:
    core = make_sim_engine(num_blocks=8)  # block_size 4: 32 tokens of KV
    async with AsyncEngine(core) as engine:
        assert engine.capacity.free_blocks == 8
        slots = engine.capacity.free_seqs
        params = SamplingParams(max_tokens=8)
        prompt = list(range(1, 9))
        async with engine.add_request(prompt, params, predicted_output_len=6):
            # before a step admits it: its prompt (2 blocks) and predicted output (2 more)
            assert engine.capacity.free_blocks == 4 and engine.capacity.free_seqs == slots - 1
            async with engine.add_request(prompt, params, predicted_output_len=100):
                assert engine.capacity.free_blocks == 0  # capped at max_tokens: 4 blocks


class GatedRunner:
    """A simulated runner whose steps wait for `release` once `gate` is set: a step held in
    flight for as long as a test needs."""

    def __init__(self, runner: SimulatedRunner) -> None:
        self.runner = runner
        self.eos_token_ids = runner.eos_token_ids
        self.hidden_size = runner.hidden_size
        self.vocab_size = runner.vocab_size
        self.gate, self.entered, self.release = (threading.Event() for _ in range(3))

    def execute(self, plan: StepPlan) -> StepOutput:
        if self.gate.is_set():
            self.entered.set()
            self.release.wait(5)
        return self.runner.execute(plan)

    async def hold(self) -> None:
        """Return once the engine's next step is in flight, held there."""
        self.gate.set()
        await anyio.to_thread.run_sync(self.entered.wait, 5)

    def let_go(self) -> None:
        """The held step ends; later steps run freely."""
        self.release.set()
        self.gate.clear()


def gated_core(num_blocks: int = 16) -> tuple[GatedRunner, LLMEngine]:
    """An engine of 4 sequences over the simulated runner, whose steps a test can hold."""
    runner = GatedRunner(SimulatedRunner(STEP_MODEL, vocab_size=500))
    config = EngineConfig(num_blocks=num_blocks, block_size=4, max_model_len=4096, max_num_seqs=4)
    return runner, LLMEngine(config, runner=runner, num_blocks=num_blocks)


async def test_capacity_counts_an_abort_while_a_step_runs_at_once() -> None:
    runner, core = gated_core(8)
    async with AsyncEngine(core) as engine:
        stream = engine.add_request(list(range(1, 9)), SamplingParams(max_tokens=20))
        async for _ in stream:  # admitted and stepping: its prompt's 2 blocks held
            break
        await runner.hold()  # a step is in flight

        def seen() -> tuple[int, int, int, int]:
            cap = engine.capacity
            return cap.free_seqs, cap.num_running, cap.num_waiting, cap.free_blocks

        assert seen() == (3, 1, 0, 6)
        engine.abort(stream.request_id)
        await stream.aclose()
        # before the step ends, its slot is one the next step has; it runs, holding its
        # blocks (which the step may be growing), until the step ends
        assert seen() == (4, 1, 0, 6)
        other = engine.add_request(list(range(1, 9)), SamplingParams(max_tokens=4))
        assert seen() == (3, 1, 1, 4)  # waiting, with its prompt's 2 blocks
        runner.let_go()
        deltas = await collect(other)
        assert sum(len(d.token_ids) for d in deltas) == 4
        await until_idle(engine)
    assert_all_blocks_free(core)


async def test_wait_idle_returns_once_the_step_in_flight_applied_an_abort() -> None:
    runner, core = gated_core()
    async with AsyncEngine(core) as engine:
        with anyio.fail_after(5):
            await engine.wait_idle()  # nothing to do: at once
        stream = engine.add_request([1, 2, 3], SamplingParams(max_tokens=20))
        async for _ in stream:
            break
        await runner.hold()  # a step is in flight
        engine.abort(stream.request_id)
        await stream.aclose()
        idle = anyio.Event()

        async def wait() -> None:
            await engine.wait_idle()
            idle.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert not idle.is_set()  # the abort waits for the step's end, with its blocks
            runner.let_go()
            with anyio.fail_after(5):
                await idle.wait()
        assert_all_blocks_free(core)


async def collect(stream: RequestStream) -> list[TokenDelta]:
    with anyio.fail_after(5):
        return [delta async for delta in stream]


def assert_all_blocks_free(core: LLMEngine) -> None:
    core.block_manager.check_invariants()
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks
    assert not core.has_unfinished


@pytest.mark.parametrize("run_in_thread", [True, False])
async def test_a_failed_step_ends_its_streams_with_error_and_serving_goes_on(
    run_in_thread: bool,
) -> None:
    core, runner = make_flaky_engine(fail_on={2}, num_blocks=64)
    async with AsyncEngine(core, run_in_thread=run_in_thread) as engine:
        doomed = engine.add_request(list(range(1, 20)), SamplingParams(max_tokens=50))
        deltas = await collect(doomed)
        assert [d.finished for d in deltas] == [False, True]
        last = deltas[-1]
        assert last.finish_reason is FinishReason.ERROR and last.token_ids == []
        assert last.request is not None and last.request.num_output_tokens == 1
        assert runner.failed_plans == [[doomed.request_id]]
        assert engine.healthy
        after = await collect(engine.add_request([5] * 9, SamplingParams(max_tokens=4)))
        assert after[-1].finish_reason is FinishReason.LENGTH
        assert sum(len(d.token_ids) for d in after) == 4
        assert_all_blocks_free(core)


async def test_healthy_turns_false_after_consecutive_failures_and_back_after_a_good_step() -> None:
    core, _ = make_flaky_engine(fail_on={1, 2, 3})
    params = SamplingParams(max_tokens=3)
    async with AsyncEngine(core, max_consecutive_failures=3) as engine:
        for _ in range(2):
            deltas = await collect(engine.add_request([7] * 5, params))
            assert deltas[-1].finish_reason is FinishReason.ERROR
            assert engine.healthy
        third = engine.add_request([7] * 5, params)
        with anyio.fail_after(5):
            await engine.health_changed()  # the loop cannot step before this waits
        assert not engine.healthy
        assert (await collect(third))[-1].finish_reason is FinishReason.ERROR
        good = engine.add_request([7] * 5, params)
        with anyio.fail_after(5):
            await engine.health_changed()
        assert engine.healthy
        assert (await collect(good))[-1].finish_reason is FinishReason.LENGTH
        assert_all_blocks_free(core)


async def test_an_error_outside_the_runner_fails_every_live_request_and_the_loop_survives(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    core = make_sim_engine(num_blocks=64, max_num_seqs=2)
    update = core.scheduler.update

    def update_then_raise(plan: StepPlan, output: StepOutput, now: float) -> StepResult:
        update(plan, output, now)  # "short" finishes inside it, before the raise
        raise RuntimeError("update failed")

    monkeypatch.setattr(core.scheduler, "update", update_then_raise)
    params = SamplingParams(max_tokens=50)
    async with AsyncEngine(core) as engine:
        streams = [
            engine.add_request([3] * 9, SamplingParams(max_tokens=1), request_id="short"),
            engine.add_request([4] * 9, params, request_id="long"),
            engine.add_request([5] * 9, params, request_id="waiting"),  # beyond max_num_seqs
        ]
        with caplog.at_level(logging.ERROR, logger="engine.async_engine"):
            ends = [(await collect(s))[-1] for s in streams]
        assert [(d.finished, d.finish_reason) for d in ends] == [(True, FinishReason.ERROR)] * 3
        assert ends[0].request is None  # finished by the broken update: its output was lost
        assert ends[1].request is not None and ends[2].request is not None
        assert [r.exc_info is not None for r in caplog.records] == [True]
        assert engine.healthy and engine.num_live == 0
        assert_all_blocks_free(core)
        monkeypatch.setattr(core.scheduler, "update", update)
        after = await collect(engine.add_request([6] * 9, SamplingParams(max_tokens=4)))
        assert after[-1].finish_reason is FinishReason.LENGTH
        assert_all_blocks_free(core)


async def test_a_request_aborted_while_a_step_runs_can_run_again_under_its_id() -> None:
    # a gateway runs a call again under its id once it gave its slot away: the abort waits for
    # the step in flight, the new attempt is submitted after it
    runner, core = gated_core()
    async with AsyncEngine(core) as engine:
        first = engine.add_request([1, 2, 3], SamplingParams(max_tokens=20), request_id="c")
        async for _ in first:
            break
        await runner.hold()  # a step is in flight
        engine.abort("c")
        await first.aclose()
        again = engine.add_request([1, 2, 3], SamplingParams(max_tokens=4), request_id="c")
        runner.let_go()
        deltas = await collect(again)
        assert sum(len(d.token_ids) for d in deltas) == 4 and deltas[-1].finished
        await until_idle(engine)
    assert_all_blocks_free(core)


async def test_an_abort_during_the_step_that_finishes_the_request_comes_too_late() -> None:
    """A gateway's yield aborted a call while the step that finished it ran: its stream ended
    without the finished delta, and the whole answer was thrown away (the call ran again)."""
    runner, core = gated_core()
    async with AsyncEngine(core) as engine:
        done = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2), request_id="done")
        cut = engine.add_request([4, 5, 6], SamplingParams(max_tokens=9), request_id="cut")
        for stream in (done, cut):
            async for _ in stream:  # both prefilled: the next step finishes only "done"
                break
        await runner.hold()  # that step is in flight
        engine.abort("done")
        engine.abort("cut")
        assert engine.num_live == 0 and engine.capacity.free_seqs == 4
        runner.let_go()
        [last] = await collect(done)  # the step finished it: its answer is whole
        assert last.finished and last.finish_reason is FinishReason.LENGTH
        assert len(last.token_ids) == 1
        assert await collect(cut) == []  # not finished: its stream just ends
        await until_idle(engine)
    assert_all_blocks_free(core)


async def test_a_stream_closed_while_the_step_that_finishes_it_runs_is_let_go() -> None:
    runner, core = gated_core()
    async with AsyncEngine(core) as engine:
        stream = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2), request_id="c")
        async for _ in stream:
            break
        await runner.hold()
        await stream.aclose()  # its reader lets go: nobody takes the finished delta
        runner.let_go()
        after = await collect(engine.add_request([1, 2], SamplingParams(max_tokens=2)))
        assert after[-1].finished  # the loop serves on
        await until_idle(engine)
    assert_all_blocks_free(core)


async def test_a_finished_streams_close_leaves_a_new_request_under_its_id() -> None:
    """A request ended, its last delta unread, and its id went to a new attempt: closing the
    old stream (its reader letting go) aborted the new one."""
    config = EngineConfig(num_blocks=16, block_size=4, max_model_len=4096)
    runner = SimulatedRunner(STEP_MODEL, vocab_size=500)
    core = LLMEngine(config, runner=runner, num_blocks=16)
    async with AsyncEngine(core, run_in_thread=False) as engine:
        old = engine.add_request([1, 2, 3], SamplingParams(max_tokens=3), request_id="c")
        await anyio.wait_all_tasks_blocked()  # it ended; its deltas wait unread
        assert not core.has_unfinished
        new = engine.add_request([1, 2, 3], SamplingParams(max_tokens=3), request_id="c")
        await old.aclose()
        deltas = await collect(new)
        assert sum(len(d.token_ids) for d in deltas) == 3 and deltas[-1].finished


async def test_a_change_deferred_past_a_step_that_fails_leaves_the_loop_serving() -> None:
    """A refused prediction, deferred while a step ran, ended the step loop and every request
    with it; now it is refused as it is asked, and a deferred change that fails is logged."""
    runner, core = gated_core()
    async with AsyncEngine(core) as engine:
        stream = engine.add_request([1, 2, 3], SamplingParams(max_tokens=6), request_id="c")
        await runner.hold()  # a step is in flight
        with pytest.raises(InvalidRequest, match="predicted_output_len"):
            engine.set_prediction("c", -1)
        engine._run(lambda: core.scheduler.set_priority("gone", 1.0))  # fails once applied
        runner.let_go()
        deltas = await collect(stream)
        assert sum(len(d.token_ids) for d in deltas) == 6 and deltas[-1].finished


async def test_steps_go_on_while_every_default_worker_thread_is_busy() -> None:
    """The steps ran on the default thread pool, which requests' parsing and tokenizing fill:
    forty large requests at once held every worker, and the engine stopped stepping."""
    core = make_sim_engine()
    default = anyio.to_thread.current_default_thread_limiter()
    holders = [object() for _ in range(int(default.total_tokens))]
    for holder in holders:
        await default.acquire_on_behalf_of(holder)
    try:
        async with AsyncEngine(core) as engine:
            stream = engine.add_request([1, 2, 3], SamplingParams(max_tokens=4))
            deltas = await collect(stream)
            assert sum(len(d.token_ids) for d in deltas) == 4 and deltas[-1].finished
    finally:
        for holder in holders:
            default.release_on_behalf_of(holder)


async def test_the_engine_fits_its_step_model_and_its_knee_from_its_own_steps() -> None:
    core = make_sim_engine(num_blocks=4096, max_num_seqs=32, max_num_batched_tokens=4096)
    async with AsyncEngine(core) as engine:
        assert engine.step_fit.knee is None  # no step yet
        streams = [
            engine.add_request([1 + i] * (4 + i), SamplingParams(max_tokens=2 + i, ignore_eos=True))
            for i in range(24)
        ]
        for stream in streams:
            await collect(stream)
    # the simulated runner's steps take the model's time: the fit gives it back exactly
    fitted = engine.step_fit.model
    assert fitted is not None and fitted.overhead_s == pytest.approx(STEP_MODEL.overhead_s)
    assert fitted.per_token_s == pytest.approx(STEP_MODEL.per_token_s)
    assert engine.step_fit.knee == knee_calls(STEP_MODEL, 0.0, 32)
