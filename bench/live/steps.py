"""The live engine's steps, timed, and the step-time model the simulation of the same run uses.

`StepRecorder` wraps the engine's model runner: for each step it keeps its shape (batched
tokens, context tokens read, prefill pairs: `StepShape`), how long `execute` took, and the
wall time since the previous step ended. `fit_step_model` fits `StepTimeModel` to the execute
times (non-negative least squares of absolute errors) and adds to its fixed cost the median time
between two steps run back to back (a gap under `BACK_TO_BACK_S`): the engine's own bookkeeping
and the gateway's work between steps on this machine, which the simulation otherwise counts as
free. `busy_step_s` is a run's mean step so counted: dividing a run's JCTs by it gives them in
steps, which a machine shared with other work slows less than seconds. Invariant: one sample per
executed plan, in order.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

from engine import Runner, StepOutput, StepPlan, StepShape, StepTimeModel

BACK_TO_BACK_S = 0.25


@dataclass(slots=True)
class StepRecorder:
    runner: Runner
    samples: list[tuple[StepShape, float]] = field(default_factory=list)  # (shape, seconds)
    gaps: list[float] = field(default_factory=list)  # seconds from a step's end to the next's start
    eos_token_ids: frozenset[int] = field(init=False)
    hidden_size: int = field(init=False)
    vocab_size: int = field(init=False)
    _last_end: float | None = None

    def __post_init__(self) -> None:
        self.eos_token_ids = self.runner.eos_token_ids
        self.hidden_size = self.runner.hidden_size
        self.vocab_size = self.runner.vocab_size

    def execute(self, plan: StepPlan) -> StepOutput:
        start = time.perf_counter()
        output = self.runner.execute(plan)
        end = time.perf_counter()
        self.samples.append((StepShape.of(plan), end - start))
        if self._last_end is not None:
            self.gaps.append(start - self._last_end)
        self._last_end = end
        return output


def busy_step_s(recorder: StepRecorder) -> float:
    """The mean time a step took, the time between back-to-back steps included."""
    busy = sum(seconds for _, seconds in recorder.samples)
    busy += sum(g for g in recorder.gaps if g < BACK_TO_BACK_S)
    return busy / max(1, len(recorder.samples))


def fit_step_model(recorders: list[StepRecorder]) -> tuple[StepTimeModel, float]:
    """The fitted model (between-step time included) and that between-step time alone."""
    model = StepTimeModel.fit([s for r in recorders for s in r.samples])
    gaps = [g for r in recorders for g in r.gaps if g < BACK_TO_BACK_S]
    between = statistics.median(gaps) if gaps else 0.0
    return dataclasses.replace(model, overhead_s=model.overhead_s + between), between
