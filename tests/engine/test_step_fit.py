"""The step model fitted online from an engine's steps, and the batch knee it gives."""

from __future__ import annotations

import random

import pytest

from engine import StepShape, StepTimeModel, prefill_pairs
from engine.step_fit import KNEE_EFFICIENCY, StepFit, knee_calls

TRUE = StepTimeModel(0.03, 0.001, 2e-6, 3e-7)
CONTEXT = 400.0  # what each decoding call reads in `decode`


def throughput(model: StepTimeModel, batch: int) -> float:
    return batch / model.step_time(batch, round(batch * CONTEXT))


@pytest.mark.parametrize("slots", [8, 64, 128, 1024])
def test_the_full_batchs_knee_is_the_least_batch_with_its_share_of_the_full_batchs_throughput(
    slots: int,
) -> None:
    knee = knee_calls(TRUE, CONTEXT, slots)
    target = KNEE_EFFICIENCY * throughput(TRUE, slots)
    assert 1 <= knee <= slots
    assert throughput(TRUE, knee) >= target * (1 - 1e-9)
    assert knee == 1 or throughput(TRUE, knee - 1) < target


def test_the_full_batchs_knee_grows_to_the_asymptotes_with_the_slots() -> None:
    knees = [knee_calls(TRUE, CONTEXT, slots) for slots in (8, 64, 128, 1024, 10**7)]
    assert knees == sorted(knees)
    assert knees[-1] == knee_calls(TRUE, CONTEXT)


def decode(batch: int) -> StepShape:
    return StepShape(batch, round(batch * CONTEXT))


def prefill(rng: random.Random) -> StepShape:
    start, chunk = rng.randint(0, 512), rng.randint(2, 256)
    return StepShape(chunk, start + chunk, prefill_pairs(start, chunk))


def test_a_fit_of_an_engines_steps_gives_its_model_and_its_knee() -> None:
    fit = StepFit(refit_every=32, max_batch=64)
    rng = random.Random(0)
    assert fit.knee is None  # nothing measured
    for i in range(64):
        shape = prefill(rng) if i % 4 == 0 else decode(rng.randint(1, 64))
        fit.observe(shape, TRUE.shape_time(shape))
    assert fit.model is not None
    assert fit.model.overhead_s == pytest.approx(TRUE.overhead_s)
    assert fit.decode_context == pytest.approx(CONTEXT, rel=1e-3)
    assert fit.knee == knee_calls(TRUE, CONTEXT, 64)


@pytest.fixture
def fit_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many steps each fit is given, in order."""
    sizes: list[int] = []
    fit_of = StepTimeModel.fit

    def counting(samples: list[tuple[StepShape, float]], relative: bool) -> StepTimeModel:
        sizes.append(len(samples))
        return fit_of(samples, relative=relative)

    monkeypatch.setattr(StepTimeModel, "fit", counting)
    return sizes


def test_an_eager_fit_refits_as_the_steps_double_then_every_refit_every(
    fit_sizes: list[int],
) -> None:
    eager, lazy = StepFit(refit_every=40, eager=True), StepFit(refit_every=40)
    for batch in range(1, 101):
        for fit in (eager, lazy):
            fit.observe(decode(batch), TRUE.shape_time(decode(batch)))
    assert fit_sizes == [3, 6, 12, 24, 40, 48, 80, 88]  # eager 3 to 48, then 88; lazy 40 and 80


@pytest.mark.parametrize("prefill_window", [0, 8])
def test_prefill_steps_that_left_the_window_still_fit_the_prefill_cost(
    prefill_window: int, fit_sizes: list[int]
) -> None:
    fit = StepFit(window=50, prefill_window=prefill_window, refit_every=50)
    rng = random.Random(1)
    shapes = [prefill(rng) for _ in range(20)]
    shapes += [decode(rng.randint(1, 64)) for _ in range(80)]  # a long stretch of decodes
    for shape in shapes:
        fit.observe(shape, TRUE.shape_time(shape))
    # two fits: the 50 latest steps, then those plus the kept prefill steps that left them
    assert fit_sizes == [50, 50 + min(prefill_window, 20)]
    assert fit.model is not None
    if prefill_window:
        assert fit.model.per_prefill_pair_s == pytest.approx(TRUE.per_prefill_pair_s)
    else:  # the window saw no prefill: the pair cost is unmeasured, so zero
        assert fit.model.per_prefill_pair_s == 0.0


def test_no_knee_without_decode_steps_or_with_next_to_no_fixed_cost_a_step() -> None:
    rng = random.Random(1)
    prefills = StepFit(refit_every=8, max_batch=64)
    linear = StepFit(refit_every=8, max_batch=64)
    no_overhead = StepTimeModel(0.0, 0.001)
    for batch in range(1, 9):
        shape = prefill(rng)
        prefills.observe(shape, TRUE.shape_time(shape))
        linear.observe(decode(batch), no_overhead.shape_time(decode(batch)))
    assert prefills.model is not None and prefills.knee is None
    assert linear.model is not None and linear.knee is None


def test_an_engine_whose_steps_cost_the_same_at_any_batch_has_its_knee_near_its_slots() -> None:
    """A fit that finds no cost a decoding call adds (memory-bound steps, the weights' read
    alone: a batch of 64 as fast as one) gives a throughput linear in the batch, so 80 % of the
    full batch's is reached at 80 % of its slots; the knee was 1, so past one call only the most
    urgent job added any."""
    fit = StepFit(refit_every=8, max_batch=64)
    flat = StepTimeModel(0.03, 0.0)
    for batch in range(1, 9):
        fit.observe(decode(batch * 8), flat.shape_time(decode(batch * 8)))
    assert fit.model is not None and fit.model.per_token_s == fit.model.per_context_token_s == 0
    assert fit.knee == knee_calls(flat, CONTEXT, 64) == 52
    assert throughput(flat, 51) < KNEE_EFFICIENCY * throughput(flat, 64) <= throughput(flat, 52)
