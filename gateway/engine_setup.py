"""Building the engine core the settings ask for: the real model, or the simulated runner."""

from __future__ import annotations

import time

from engine import EngineConfig, LLMEngine, ReserveMode, SimulatedRunner, StepTimeModel
from gateway.settings import Settings


def engine_config(settings: Settings) -> EngineConfig:
    return EngineConfig(
        model=settings.model,
        dtype=settings.dtype,
        num_threads=settings.num_threads,
        kv_cache_bytes=settings.kv_cache_mb << 20,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len,
        reserve_mode=ReserveMode(settings.reserve_mode),
    )


def build_engine_core(settings: Settings) -> LLMEngine:
    """The engine core; loads (and on first use converts) the model, so it takes a while."""
    config = engine_config(settings)
    if not settings.simulated_engine:
        return LLMEngine(config, clock=time.monotonic)
    from engine.loader import load_tokenizer, resolve_model  # loads transformers' model code

    tokenizer = load_tokenizer(resolve_model(settings.model))
    step_s = settings.simulated_step_s
    runner = SimulatedRunner(
        StepTimeModel(step_s, 0.0),
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        realtime=step_s > 0,
    )
    return LLMEngine(
        config, runner=runner, tokenizer=tokenizer, clock=time.monotonic, num_blocks=8192
    )
