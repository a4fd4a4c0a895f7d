"""The simulated model runner of the study: the engine's own, told each call's true length.

`engine.SimulatedRunner` models step time and samples tokens that are never end-of-sequence;
here the token that completes a request's true output length is the end-of-sequence token, as
if the model stopped there, so the scheduler ends the request itself (and a request preempted
and recomputed still ends at the same length). Invariant: a registered request never outputs
more than its true length, and the runner learns no other fact about it.
"""

from __future__ import annotations

from engine import SimulatedRunner, StepOutput, StepPlan, StepTimeModel


class TraceRunner(SimulatedRunner):
    def __init__(self, model: StepTimeModel) -> None:
        super().__init__(model)
        self._eos_token = min(self.eos_token_ids)
        self._lengths: dict[str, int] = {}

    def expect(self, request_id: str, output_tokens: int) -> None:
        """The request will generate exactly `output_tokens` tokens (EOS included)."""
        self._lengths[request_id] = output_tokens

    def execute(self, plan: StepPlan) -> StepOutput:
        output = super().execute(plan)
        for seq in plan.seqs:
            if seq.sample and seq.num_output_tokens + 1 >= self._lengths[seq.request_id]:
                output.sampled[seq.request_id] = self._eos_token
        for request_id in plan.freed_ids:
            self._lengths.pop(request_id, None)
        return output
