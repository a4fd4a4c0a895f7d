"""A real engine core over the simulated runner and the small byte-level tokenizer, for tests
of what sits on the engine (its HTTP server, the gateway). Its tokens are a hash of the call and
position, never end-of-sequence: every call makes exactly max_tokens."""

from __future__ import annotations

import time
from typing import Any

from engine import EngineConfig, LLMEngine, SimulatedRunner, StepTimeModel
from tests.engine.byte_tokenizer import byte_tokenizer


def sim_core(
    step_s: float = 0.0,
    num_blocks: int = 4096,
    hidden_size: int = 0,
    max_model_len: int = 4096,
    tokenizer: Any = None,
    max_num_seqs: int = 128,
) -> LLMEngine:
    """`step_s` > 0 makes each step take that long in real time; `max_num_seqs` calls run at
    once."""
    tokenizer = tokenizer if tokenizer is not None else byte_tokenizer()
    runner = SimulatedRunner(
        StepTimeModel(step_s, 0.0),
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        realtime=step_s > 0,
        hidden_size=hidden_size,
    )
    config = EngineConfig(
        num_blocks=num_blocks,
        block_size=16,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
    )
    return LLMEngine(
        config, runner=runner, tokenizer=tokenizer, clock=time.monotonic, num_blocks=num_blocks
    )
