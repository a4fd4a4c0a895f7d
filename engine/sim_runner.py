"""A simulated model runner: same step contract, modelled step time, synthetic tokens.

Step time is linear in what a step does (`StepShape`): a fixed overhead, a cost per batched
token (the GEMMs), a cost per token of context read by attention, and a cost per query-key pair
of a prefill chunk's causal attention (quadratic in the chunk's length, so a big chunk late in a
long prompt costs more than its tokens alone say; a decode's attention is its context),

    t = overhead_s + per_token_s * num_batched_tokens + per_context_token_s * sum(context)
        + per_prefill_pair_s * sum(chunk * start + chunk * (chunk + 1) / 2 for chunks > 1 token)

fitted by non-negative least squares (of absolute or relative errors) to measured steps of the
real engine.
Sampled tokens are a hash of the request id and position, never an end-of-sequence id, so
lengths are set by max_tokens, unless a request was given a true output length: then it emits
end-of-sequence there (so a request can carry a large max_tokens and still stop where the trace
says it did). With `hidden_size`, a request that asks for its prompt's hidden state gets a
synthetic one (a hash of its id) with its first token, as the real runner hands it out.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.plan import StepOutput, StepPlan


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a step computes, in the units the step-time model charges."""

    num_batched_tokens: int
    context_tokens: int  # sum over sequences of start_pos + len(token_ids)
    prefill_pairs: int = 0  # causal query-key pairs of the chunks of more than one token

    @classmethod
    def chunk(cls, start: int, tokens: int) -> StepShape:
        """A step that prefills one chunk of `tokens` prompt tokens at position `start`."""
        return cls(tokens, start + tokens, prefill_pairs(start, tokens))

    @classmethod
    def of(cls, plan: StepPlan) -> StepShape:
        return cls(
            plan.num_batched_tokens,
            sum(s.start_pos + len(s.token_ids) for s in plan.seqs),
            sum(prefill_pairs(s.start_pos, len(s.token_ids)) for s in plan.seqs),
        )


def prefill_pairs(start: int, chunk: int) -> int:
    """Query-key pairs of a chunk of `chunk` tokens at position `start`; 0 for a single token."""
    return chunk * start + chunk * (chunk + 1) // 2 if chunk > 1 else 0


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    overhead_s: float
    per_token_s: float
    per_context_token_s: float = 0.0
    per_prefill_pair_s: float = 0.0

    def step_time(self, num_batched_tokens: int, context_tokens: int, pairs: int = 0) -> float:
        """A step's time; `pairs`: its prefill chunks' query-key pairs (`prefill_pairs`)."""
        return (
            self.overhead_s
            + self.per_token_s * num_batched_tokens
            + self.per_context_token_s * context_tokens
            + self.per_prefill_pair_s * pairs
        )

    def shape_time(self, shape: StepShape) -> float:
        return self.step_time(shape.num_batched_tokens, shape.context_tokens, shape.prefill_pairs)

    def plan_time(self, plan: StepPlan) -> float:
        return self.shape_time(StepShape.of(plan))

    @classmethod
    def fit(
        cls, samples: Sequence[tuple[StepShape, float]], *, relative: bool = False
    ) -> StepTimeModel:
        """Fit to (shape, seconds) samples by non-negative least squares.

        `relative` minimises relative rather than absolute errors, so that a few long steps (a
        calibration's big prefills) do not decide the fit of the many short ones (decodes). A
        column the samples never exercise (no prefill chunk: no pairs) gets a zero coefficient.
        Needs scipy (a runtime dependency; imported here so the engine starts without it loaded).
        """
        from scipy.optimize import nnls

        if len(samples) < 3:
            raise ValueError("need at least 3 measured steps to fit a step-time model")
        design = np.array(
            [(1.0, s.num_batched_tokens, s.context_tokens, s.prefill_pairs) for s, _ in samples]
        )
        target = np.array([seconds for _, seconds in samples], dtype=np.float64)
        if relative:
            if np.any(target <= 0):
                raise ValueError("a relative fit needs positive step times")
            design, target = design / target[:, None], np.ones(len(samples))
        scale = np.abs(design).max(axis=0)  # columns span many orders of magnitude
        scale[scale == 0] = 1.0  # a column never exercised stays zero
        coef, _ = nnls(design / scale, target)
        overhead, per_token, per_context, per_pair = (float(c) for c in coef / scale)
        return cls(overhead, per_token, per_context, per_pair)


class SimulatedRunner:
    """Executes plans instantly; `elapsed_s` in the output is the modelled step time.

    With `realtime`, a step also takes its modelled time on the wall clock (it sleeps), so a
    live gateway sees an engine of that speed.
    """

    def __init__(
        self,
        model: StepTimeModel,
        vocab_size: int = 32000,
        eos_token_id: int = 0,
        realtime: bool = False,
        hidden_size: int = 0,
    ) -> None:
        self.model = model
        self.hidden_size = hidden_size  # > 0: hand out synthetic hidden vectors
        self.realtime = realtime
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset({eos_token_id})
        self._eos = eos_token_id
        self._lengths: dict[str, int] = {}

    def set_output_length(self, request_id: str, num_tokens: int) -> None:
        """Make the request's `num_tokens`-th output token an end-of-sequence."""
        self._lengths[request_id] = num_tokens

    def execute(self, plan: StepPlan) -> StepOutput:
        sampled, hidden = {}, {}
        for seq in plan.seqs:
            if not seq.sample:
                continue
            pos = seq.start_pos + len(seq.token_ids)
            ends = self._lengths.get(seq.request_id) == seq.num_output_tokens + 1
            sampled[seq.request_id] = self._eos if ends else self._token(seq.request_id, pos)
            if seq.want_hidden and self.hidden_size:
                hidden[seq.request_id] = self.hidden_vector(seq.request_id)
        for request_id in plan.freed_ids:
            self._lengths.pop(request_id, None)
        elapsed = self.model.plan_time(plan)
        if self.realtime:
            time.sleep(elapsed)
        return StepOutput(sampled=sampled, elapsed_s=elapsed, hidden=hidden)

    def hidden_vector(self, request_id: str) -> list[float]:
        """The request's synthetic hidden vector: values in [-1, 1], a hash of its id."""
        return [
            zlib.crc32(f"{request_id}:h{i}".encode()) % 2001 / 1000 - 1
            for i in range(self.hidden_size)
        ]

    def _token(self, request_id: str, position: int) -> int:
        token = zlib.crc32(f"{request_id}:{position}".encode()) % self.vocab_size
        return token if token != self._eos else (token + 1) % self.vocab_size
