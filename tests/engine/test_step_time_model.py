"""The step-time model: a plan's shape, and the fit to measured steps."""

from __future__ import annotations

import pytest

from engine import SamplingParams, ScheduledSeq, StepPlan, StepShape, StepTimeModel, prefill_pairs

TRUE = StepTimeModel(0.015, 0.0008, 2e-6, 3e-7)
# decodes (no pairs), first prefill chunks and a chunk late in a long prompt
SHAPES = [
    StepShape(1, 256),
    StepShape(4, 1024),
    StepShape(16, 4096),
    StepShape(32, 8192),
    StepShape(128, 128, prefill_pairs(0, 128)),
    StepShape(256, 256, prefill_pairs(0, 256)),
    StepShape(512, 1024, prefill_pairs(512, 512)),
    StepShape(512, 512, prefill_pairs(0, 512)),
]


def measured(model: StepTimeModel, slow_last: float = 1.0) -> list[tuple[StepShape, float]]:
    samples = [(shape, model.shape_time(shape)) for shape in SHAPES]
    shape, seconds = samples[-1]
    samples[-1] = (shape, seconds * slow_last)
    return samples


def test_prefill_pairs_count_causal_attention_of_chunks_only() -> None:
    assert prefill_pairs(0, 3) == 1 + 2 + 3  # token j of the chunk reads j + 1 positions
    assert prefill_pairs(10, 2) == 11 + 12
    assert prefill_pairs(500, 1) == 0  # a decode's (or a one-token chunk's) read is its context


def test_a_plans_shape_sums_its_sequences() -> None:
    params = SamplingParams(max_tokens=8)
    plan = StepPlan(
        [
            ScheduledSeq("d", [7], 99, [0] * 7, True, params, 3),  # a decode at position 99
            ScheduledSeq("p", [1] * 64, 128, [0] * 12, False, params, 0),  # a middle chunk
        ],
        65,
    )
    pairs = 64 * 128 + 64 * 65 // 2
    assert StepShape.of(plan) == StepShape(65, 100 + 192, pairs)
    assert TRUE.plan_time(plan) == pytest.approx(0.015 + 0.0008 * 65 + 2e-6 * 292 + 3e-7 * pairs)
    assert StepShape.chunk(128, 64) == StepShape(64, 192, pairs)


@pytest.mark.parametrize("relative", [False, True])
def test_exact_steps_give_back_the_model(relative: bool) -> None:
    fitted = StepTimeModel.fit(measured(TRUE), relative=relative)
    assert fitted.overhead_s == pytest.approx(TRUE.overhead_s, rel=1e-6)
    assert fitted.per_token_s == pytest.approx(TRUE.per_token_s, rel=1e-6)
    assert fitted.per_context_token_s == pytest.approx(TRUE.per_context_token_s, rel=1e-6)
    assert fitted.per_prefill_pair_s == pytest.approx(TRUE.per_prefill_pair_s, rel=1e-6)


def test_decodes_alone_fit_no_pair_cost_and_no_negative_coefficient() -> None:
    true = StepTimeModel(0.015, 0.0008, 2e-6)
    batches = [(1, 256), (8, 256), (4, 1024), (16, 1024), (32, 8192)]
    decodes = [(StepShape(b, c), true.step_time(b, c)) for b, c in batches]
    fitted = StepTimeModel.fit(decodes, relative=True)
    assert fitted.per_prefill_pair_s == 0.0
    assert fitted.per_token_s == pytest.approx(true.per_token_s, rel=1e-6)
    # steps that got cheaper with context would need a negative coefficient: it is held at 0
    cheaper = [(StepShape(1, c), 0.02 - c * 1e-6) for c in (100, 1000, 5000)]
    assert StepTimeModel.fit(cheaper).per_context_token_s == 0.0


def test_a_relative_fit_keeps_short_steps_right_beside_one_slow_long_step() -> None:
    samples = measured(TRUE, slow_last=1.6)  # the 512-token prefill ran 60 % slower than modelled
    one_token = TRUE.step_time(1, 256)
    absolute = StepTimeModel.fit(samples).step_time(1, 256)
    relative = StepTimeModel.fit(samples, relative=True).step_time(1, 256)
    assert abs(relative / one_token - 1) < 0.25
    assert abs(absolute / one_token - 1) > 2 * abs(relative / one_token - 1)


def test_too_few_or_non_positive_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        StepTimeModel.fit(measured(TRUE)[:2])
    zero = [(StepShape(1, 1), 0.01), (StepShape(2, 2), 0.0), (StepShape(3, 3), 0.02)]
    with pytest.raises(ValueError, match="positive"):
        StepTimeModel.fit(zero, relative=True)
