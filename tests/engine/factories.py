"""Small builders shared by the engine tests."""

from __future__ import annotations

import dataclasses

from engine.block_manager import BlockManager
from engine.config import EngineConfig, ReserveMode
from engine.llm import LLMEngine
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
