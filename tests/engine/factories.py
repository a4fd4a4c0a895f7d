"""Small builders shared by the engine tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from engine.block_manager import BlockManager
from engine.config import EngineConfig, ReserveMode
from engine.llm import LLMEngine
from engine.plan import StepOutput, StepPlan
from engine.request import Request
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.sim_runner import SimulatedRunner, StepTimeModel

STEP_MODEL = StepTimeModel(overhead_s=0.01, per_token_s=0.001)


def make_request(
    rid: str, prompt_len: int, max_tokens: int = 8, priority: float = 0.0, arrival: float = 0.0
) -> Request:
    prompt = [(7 * i + len(rid)) % 1000 + 1 for i in range(prompt_len)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, prompt, params, arrival_time=arrival, priority=priority)


def make_scheduler(
    num_blocks: int = 8,
    block_size: int = 4,
    token_budget: int = 64,
    max_num_seqs: int = 16,
    reserve_mode: ReserveMode = ReserveMode.NONE,
) -> Scheduler:
    config = EngineConfig(
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_batched_tokens=token_budget,
        max_num_seqs=max_num_seqs,
        reserve_mode=reserve_mode,
        max_model_len=4096,
    )
    return Scheduler(config, BlockManager(num_blocks, block_size), frozenset({0}))


def make_sim_engine(num_blocks: int = 64, **overrides: object) -> LLMEngine:
    config = EngineConfig(num_blocks=num_blocks, block_size=4, max_model_len=4096)
    config = dataclasses.replace(config, **overrides)  # type: ignore[arg-type]
    runner = SimulatedRunner(STEP_MODEL, vocab_size=500)
    return LLMEngine(config, runner=runner, num_blocks=num_blocks)


class FlakyRunner:
    """A simulated runner whose `execute` raises on the given calls (1-based)."""

    def __init__(self, runner: SimulatedRunner, fail_on: Collection[int]) -> None:
        self.runner = runner
        self.eos_token_ids = runner.eos_token_ids
        self.hidden_size = runner.hidden_size
        self.vocab_size = runner.vocab_size
        self.fail_on = fail_on
        self.num_calls = 0
        self.failed_plans: list[list[str]] = []  # request ids of each plan it failed

    def execute(self, plan: StepPlan) -> StepOutput:
        self.num_calls += 1
        if self.num_calls in self.fail_on:
            self.failed_plans.append([seq.request_id for seq in plan.seqs])
            raise RuntimeError(f"runner failed on call {self.num_calls}")
        return self.runner.execute(plan)


def make_flaky_engine(
    fail_on: Collection[int], num_blocks: int = 64, **overrides: object
) -> tuple[LLMEngine, FlakyRunner]:
    """A simulated engine whose runner raises on the given step calls."""
    engine = make_sim_engine(num_blocks, **overrides)
    assert isinstance(engine.runner, SimulatedRunner)
    runner = FlakyRunner(engine.runner, fail_on)
    engine.runner = runner
    return engine, runner
