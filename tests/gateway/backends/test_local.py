"""The `local` backend: the engine in this process, its room as the dispatch core reads it."""

from __future__ import annotations

import pytest

from engine import AsyncEngine, SamplingParams
from engine.step_fit import knee_calls
from gateway.backends import BackendCall, LocalBackend
from tests.engine.factories import STEP_MODEL, make_sim_engine

pytestmark = pytest.mark.anyio


async def test_its_capacity_carries_the_knee_the_engine_measured_from_its_steps() -> None:
    core = make_sim_engine(num_blocks=4096, max_num_seqs=16, max_num_batched_tokens=4096)
    async with AsyncEngine(core) as engine:
        backend = LocalBackend(engine, "sim")
        assert backend.capacity().knee_calls is None  # nothing measured yet
        streams = [
            backend.submit(
                BackendCall(f"c{i}", [1 + i] * 8, SamplingParams(max_tokens=2 + i, ignore_eos=True))
            )
            for i in range(12)
        ]
        for stream in streams:  # decoded together: steps of 12 calls down to 1
            async for _ in stream:
                pass
        assert backend.capacity().knee_calls == knee_calls(STEP_MODEL, 0.0, 16)
