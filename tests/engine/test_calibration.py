"""The calibration steps an engine runs before it serves: its step model and knee from them."""

from __future__ import annotations

import pytest

from engine import AsyncEngine, SamplingParams
from engine.calibration import DECODE_STEPS, calibrate, calibration_batches
from engine.step_fit import knee_calls
from tests.engine.factories import STEP_MODEL, make_sim_engine

pytestmark = pytest.mark.anyio


def test_the_batches_run_from_one_call_to_the_full_batch_once_each() -> None:
    assert calibration_batches(64) == [1, 16, 32, 64]
    assert calibration_batches(2) == [1, 2]
    assert calibration_batches(1) == [1]


async def test_calibration_gives_the_engine_its_step_model_and_knee_before_any_call() -> None:
    core = make_sim_engine(num_blocks=4096, max_num_seqs=32, max_num_batched_tokens=4096)
    batches: list[int] = []
    execute = core.runner.execute

    def recorded(plan):  # type: ignore[no-untyped-def]
        batches.append(plan.num_batched_tokens)
        return execute(plan)

    core.runner.execute = recorded  # type: ignore[method-assign]
    async with AsyncEngine(core) as engine:
        assert engine.step_fit.knee is None
        await calibrate(engine)
        assert not core.has_unfinished  # its calls are gone: every slot is free to serve
    # each size's prompt step and its decode steps, one size after another
    steps = DECODE_STEPS + 1
    assert batches == [size for size in calibration_batches(32) for _ in range(steps)]
    fitted = engine.step_fit.model
    assert fitted is not None and fitted.overhead_s == pytest.approx(STEP_MODEL.overhead_s)
    assert fitted.per_token_s == pytest.approx(STEP_MODEL.per_token_s)
    context = engine.step_fit.decode_context
    assert context is not None and engine.step_fit.knee == knee_calls(STEP_MODEL, context, 32)


async def test_a_full_batch_alone_leaves_the_fixed_cost_unknown() -> None:
    # why calibrate: steps of one size cannot tell the fixed cost from the calls' (the fit
    # puts it all on the calls, and finds no knee), where the calibration's sizes can
    core = make_sim_engine(num_blocks=4096, max_num_seqs=32, max_num_batched_tokens=4096)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    async with AsyncEngine(core) as engine:
        streams = [engine.add_request([1], params) for _ in range(32)]
        for stream in streams:
            async for _ in stream:
                pass
        engine.step_fit.refit()
    fitted = engine.step_fit.model
    assert fitted is not None and fitted.overhead_s != pytest.approx(STEP_MODEL.overhead_s)
