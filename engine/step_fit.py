"""A step-time model fitted online from an engine's own steps, and the batch knee it implies.

`StepFit` keeps the last `window` measured steps and refits `StepTimeModel` to them by
non-negative least squares of relative errors (so the few long prefill steps do not decide the
fit of the many decode steps) every `refit_every` steps; an `eager` fit also refits each time
the steps seen have doubled before that (after 3, 6, 12, ...), so an engine that has just
started has a model after a few steps. The last `prefill_window` steps with
prefill pairs are kept apart and join the fit once they have left the window, so a stretch of
decodes alone never leaves the prefill cost unmeasured. Decode steps (one token per sequence)
also give the mean context a decoding call reads, which the knee depends on; for an engine of
`max_batch` slots each fit also sets its `knee` (read on every capacity snapshot, so kept rather
than derived at each read).

`knee_calls` is the decode batch past which adding a call buys little throughput: where it
reaches `KNEE_EFFICIENCY` of the asymptote's, or, for an engine of `max_batch` slots, of the full
batch's (an engine whose slots end well before the asymptote never reaches 80 % of it).
Invariant: a step enters any one fit at most once; each window holds at most its size.
"""

from __future__ import annotations

import math
from collections import deque

from engine.sim_runner import StepShape, StepTimeModel

KNEE_EFFICIENCY = 0.8
# a fitted fixed cost under this share of the full batch's step is within a fit's noise: its knee
# (a call or two) would hold back every job but the most urgent for no gain that was measured
KNEE_MIN_OVERHEAD = 0.01


def knee_calls(model: StepTimeModel, mean_context: float, max_batch: int | None = None) -> int:
    """The decode batch at which throughput reaches `KNEE_EFFICIENCY` of its asymptote, or, for
    an engine of `max_batch` slots, of the full batch's: `B / (o + B k) >= e S / (o + S k)`, i.e.
    `B = ceil(e S o / (o + (1 - e) S k))` (the asymptote's as S grows), with `k` a decoding
    call's cost in a step (its token and the context it reads). With no fixed cost every batch
    is as efficient (1); with no cost a call adds, throughput grows with the batch to the last
    slot (`e S`)."""
    per_call = model.per_token_s + model.per_context_token_s * mean_context
    e, o = KNEE_EFFICIENCY, model.overhead_s
    if o <= 0 or (max_batch is None and per_call <= 0):
        return 1
    if max_batch is None:
        return max(1, math.ceil(o / per_call * e / (1.0 - e)))
    return max(1, math.ceil(e * max_batch * o / (o + (1.0 - e) * max_batch * per_call)))


class StepFit:
    def __init__(
        self,
        model: StepTimeModel | None = None,
        *,
        window: int = 1024,
        prefill_window: int = 64,
        refit_every: int = 64,
        eager: bool = False,
        max_batch: int | None = None,
    ) -> None:
        if window < 3 or refit_every < 1 or prefill_window < 0:
            raise ValueError("need window >= 3, refit_every >= 1 and prefill_window >= 0")
        self.model = model  # None until the first fit, unless a starting model is given
        # the mean context a decoding call read over the window's decode steps (a token per
        # sequence, no prefill chunk), as of the last fit; None when there were none
        self.decode_context: float | None = None
        self.max_batch = max_batch
        # the full batch's knee as of the last fit: None before one, without `max_batch` or
        # decode steps, or when the fit finds next to no fixed cost a step (`KNEE_MIN_OVERHEAD`)
        self.knee: int | None = None
        self.refit_every = refit_every
        self.eager = eager
        self._samples: deque[tuple[StepShape, float]] = deque(maxlen=window)
        self._prefills: deque[tuple[int, StepShape, float]] = deque(maxlen=prefill_window)
        self._num_steps = 0
        self._since_fit = 0

    def observe(self, shape: StepShape, seconds: float) -> bool:
        """Record one measured step; True when it refitted the model."""
        self._samples.append((shape, seconds))
        if shape.prefill_pairs:
            self._prefills.append((self._num_steps, shape, seconds))
        self._num_steps += 1
        self._since_fit += 1
        due = self.refit_every
        if self.eager:  # the steps seen at the last fit, or 3 before the first
            due = min(due, max(3, self._num_steps - self._since_fit))
        if self._since_fit < due:
            return False
        return self.refit()

    def refit(self) -> bool:
        """Fit the model (and the knee) to the steps kept now; False with fewer than 3."""
        if len(self._samples) < 3:
            return False
        first_in_window = self._num_steps - len(self._samples)
        older = [(sh, s) for i, sh, s in self._prefills if i < first_in_window]
        self.model = StepTimeModel.fit([*older, *self._samples], relative=True)
        decodes = [s for s, _ in self._samples if not s.prefill_pairs and s.num_batched_tokens]
        calls = sum(s.num_batched_tokens for s in decodes)
        self.decode_context = sum(s.context_tokens for s in decodes) / calls if calls else None
        self.knee = self._knee(self.model, self.decode_context)
        self._since_fit = 0
        return True

    def _knee(self, model: StepTimeModel, context: float | None) -> int | None:
        if self.max_batch is None or context is None:
            return None
        full = model.step_time(self.max_batch, round(self.max_batch * context))
        if model.overhead_s < KNEE_MIN_OVERHEAD * full:
            return None
        return knee_calls(model, context, self.max_batch)
