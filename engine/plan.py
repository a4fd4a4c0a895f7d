"""The step contract: the scheduler's plan for one model step and the runner's answer.

Plain data only (ids, counts, block ids), so the scheduler is testable without a model and the
same plan drives the real or the simulated runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    request_id: str
    token_ids: list[int]  # the tokens fed this step: a prefill chunk or the one decode token
    start_pos: int  # position of token_ids[0]; KV for [0, start_pos) is already in block_ids
    block_ids: list[int]  # the request's whole block table (covers start_pos + len(token_ids))
    sample: bool  # True when this chunk reaches the end of the known tokens: sample one token
    params: SamplingParams
    num_output_tokens: int  # output tokens so far (seeds a per-request generator's offset)
    want_hidden: bool = False  # on the sampling chunk: hand out the prompt's hidden state


@dataclass(frozen=True, slots=True)
class StepPlan:
    seqs: list[ScheduledSeq]
    num_batched_tokens: int  # sum of len(token_ids): what the step costs
    preempted_ids: list[str] = field(default_factory=list)  # runner drops any state kept for them
    freed_ids: list[str] = field(default_factory=list)  # finished/aborted since the last plan

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass(slots=True)
class StepOutput:
    sampled: dict[str, int]  # request id -> token, for every seq with sample=True
    hidden: dict[str, list[float]] = field(default_factory=dict)  # prompts' hidden states
    elapsed_s: float = 0.0  # measured (or modelled) time of the step
