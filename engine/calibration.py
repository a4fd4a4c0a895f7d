"""Decoding steps at batch sizes from one call to the full batch, run before an engine serves.

An engine serving a full batch runs every step at one size, so its step-time fit (`StepFit`)
cannot tell a step's fixed cost from what each call adds, and its knee stays unknown or wrong
until the batch changes; a few steps at each of a handful of sizes, measured like any others,
tell them apart from the first call on. Each calibration call has a one-token prompt (its
prefill is a step of single tokens, shaped as a decode) and decodes `decode_steps` tokens with
end-of-sequence ignored, so every size runs the same number of steps.
"""

from __future__ import annotations

import anyio

from engine.async_engine import AsyncEngine, RequestStream
from engine.sampling import SamplingParams

DECODE_STEPS = 4
PROMPT = [0]  # any token of any vocabulary


def calibration_batches(max_batch: int) -> list[int]:
    """One call, a quarter, half and all of the batch's slots (each once)."""
    return sorted({1, max(1, max_batch // 4), max(1, max_batch // 2), max_batch})


async def calibrate(engine: AsyncEngine, decode_steps: int = DECODE_STEPS) -> None:
    """Run the calibration batches one after another, then refit the engine's step model."""
    params = SamplingParams(max_tokens=decode_steps + 1, ignore_eos=True, temperature=0.0)
    for size in calibration_batches(engine.core.config.max_num_seqs):
        streams = [
            engine.add_request(PROMPT, params, request_id=f"calibration-{size}-{i}")
            for i in range(size)
        ]
        async with anyio.create_task_group() as tg:
            for stream in streams:
                tg.start_soon(_drain, stream)
    engine.step_fit.refit()


async def _drain(stream: RequestStream) -> None:
    async with stream:
        async for _ in stream:
            pass
