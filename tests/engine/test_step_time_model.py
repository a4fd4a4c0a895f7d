"""The step-time model's fit to measured steps."""

from __future__ import annotations

import pytest

from engine.sim_runner import StepTimeModel

TRUE = StepTimeModel(0.015, 0.0008, 2e-6)
SHAPES = [(1, 256), (4, 1024), (16, 4096), (32, 8192), (128, 128), (256, 256), (512, 512)]


def measured(model: StepTimeModel, slow_last: float = 1.0) -> list[tuple[int, int, float]]:
    samples = [(t, c, model.step_time(t, c)) for t, c in SHAPES]
    t, c, s = samples[-1]
    samples[-1] = (t, c, s * slow_last)
    return samples


@pytest.mark.parametrize("relative", [False, True])
def test_exact_steps_give_back_the_model(relative: bool) -> None:
    fitted = StepTimeModel.fit(measured(TRUE), relative=relative)
    assert fitted.overhead_s == pytest.approx(TRUE.overhead_s, rel=1e-6)
    assert fitted.per_token_s == pytest.approx(TRUE.per_token_s, rel=1e-6)
    assert fitted.per_context_token_s == pytest.approx(TRUE.per_context_token_s, rel=1e-6)


def test_a_relative_fit_keeps_short_steps_right_beside_one_slow_long_step() -> None:
    samples = measured(TRUE, slow_last=1.6)  # the 512-token prefill ran 60 % slower than linear
    one_token = TRUE.step_time(1, 256)
    absolute = StepTimeModel.fit(samples).step_time(1, 256)
    relative = StepTimeModel.fit(samples, relative=True).step_time(1, 256)
    assert abs(relative / one_token - 1) < 0.25
    assert abs(absolute / one_token - 1) > 2 * abs(relative / one_token - 1)


def test_too_few_or_non_positive_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        StepTimeModel.fit(measured(TRUE)[:2])
    with pytest.raises(ValueError, match="positive"):
        StepTimeModel.fit([(1, 1, 0.01), (2, 2, 0.0), (3, 3, 0.02)], relative=True)
