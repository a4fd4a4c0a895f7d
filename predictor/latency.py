"""Latency model: TTFT and completion time of calls, from engine state and a step-time model.

A step's time is `engine.StepTimeModel` (fixed overhead + cost per batched token + cost per
token of context + cost per query-key pair of a prefill chunk), calibrated online by
`engine.step_fit.StepFit` from measured steps (a call's TTFT is mostly prefill: that fit keeps
prefill steps apart so their cost stays measured). Arrivals go into another
window, whose mean gap and sizes are the traffic expected to join behind a call. An estimate
replays the engine's continuous batching on the model (`predictor.replay`) from a snapshot of
the engine's state.
Invariant: each window holds at most its size; a step enters any one fit at most once;
nothing here reads the clock (`observe_arrival` takes `now`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from engine.request import Request
from engine.sim_runner import StepShape, StepTimeModel
from engine.step_fit import StepFit
from predictor.errors import InvalidCall
from predictor.replay import (
    ArrivalLoad,
    DecodingCall,
    EngineState,
    Estimate,
    QueuedCall,
    Replay,
)

__all__ = [
    "ArrivalLoad",
    "DecodingCall",
    "EngineState",
    "Estimate",
    "LatencyModel",
    "QueuedCall",
    "engine_state",
]


def engine_state(
    running: Iterable[Request],
    waiting: Iterable[Request],
    remaining_output: Callable[[Request], int],
) -> EngineState:
    """Describe an engine's scheduler (`running`, `waiting`) for the replay.

    `remaining_output(request)` is the number of tokens the request is expected to still
    generate (>= 1): a prediction, or the truth when it is known. Requests are ordered as the
    scheduler admits them: mid-prefill running ones first, then the waiting ones.
    """
    decoding: list[DecodingCall] = []
    queue: list[QueuedCall] = []
    for r in sorted(running, key=lambda r: r.sort_key):
        if r.num_computed_tokens >= r.num_tokens - 1 and r.num_output_tokens:
            decoding.append(DecodingCall(r.num_tokens, remaining_output(r)))
        else:
            queue.append(QueuedCall(r.num_tokens, remaining_output(r), r.num_computed_tokens))
    for r in sorted(waiting, key=lambda r: r.sort_key):
        queue.append(QueuedCall(r.num_tokens, remaining_output(r)))
    return EngineState(decoding, queue)


class LatencyModel:
    def __init__(
        self,
        step_model: StepTimeModel,
        *,
        token_budget: int,
        max_num_seqs: int,
        window: int = 1024,
        prefill_window: int = 64,
        refit_every: int = 64,
        arrival_window: int = 64,
    ) -> None:
        if not 1 <= max_num_seqs < token_budget or window < 3 or refit_every < 1:
            raise InvalidCall(
                "need 1 <= max_num_seqs < token_budget (every decode fits a step), "
                "window >= 3, refit_every >= 1"
            )
        if arrival_window < 2 or prefill_window < 0:
            raise InvalidCall("arrival_window must be >= 2 and prefill_window >= 0")
        self.step_model = step_model
        self.token_budget, self.max_num_seqs = token_budget, max_num_seqs
        self.steps = StepFit(
            step_model, window=window, prefill_window=prefill_window, refit_every=refit_every
        )
        self._arrivals: deque[tuple[float, int, int]] = deque(maxlen=arrival_window)

    def observe_step(self, shape: StepShape, seconds: float) -> None:
        """Record one measured engine step; refit the step-time model every few of them."""
        if self.steps.observe(shape, seconds) and self.steps.model is not None:
            self.step_model = self.steps.model

    def observe_arrival(self, now: float, prompt_tokens: int, output_tokens: int) -> None:
        """Record a call's arrival (`output_tokens`: its predicted length)."""
        if self._arrivals and now < self._arrivals[-1][0]:
            raise InvalidCall("arrivals must be observed in time order")
        self._arrivals.append((now, prompt_tokens, output_tokens))

    def expected_load(self) -> ArrivalLoad | None:
        """Mean gap and sizes of the recent arrivals; None until two arrivals apart in time."""
        if len(self._arrivals) < 2 or self._arrivals[-1][0] <= self._arrivals[0][0]:
            return None
        n = len(self._arrivals)
        gap = (self._arrivals[-1][0] - self._arrivals[0][0]) / (n - 1)
        prompt = round(sum(a[1] for a in self._arrivals) / n)
        output = round(sum(a[2] for a in self._arrivals) / n)
        return ArrivalLoad(gap, max(prompt, 1), max(output, 1))

    def estimate(self, state: EngineState, call: QueuedCall) -> Estimate:
        """A new call that joins the end of the queue."""
        return self.estimate_queue(EngineState(state.decoding, [*state.queue, call]))[-1]

    def estimate_queue(self, state: EngineState, with_load: bool = True) -> list[Estimate]:
        """One estimate per queued call, in queue order; `with_load` adds expected traffic."""
        for q in state.queue:
            if q.output_tokens < 1 or not 0 <= q.prefilled < q.prompt_tokens:
                raise InvalidCall(f"queued call needs output >= 1 and 0 <= prefilled < prompt: {q}")
        for d in state.decoding:
            if d.remaining_output < 1 or d.num_tokens < 1:
                raise InvalidCall(f"decoding call needs tokens and remaining output >= 1: {d}")
        load = self.expected_load() if with_load else None
        return Replay(self.step_model, self.token_budget, self.max_num_seqs, state, load).run()
