"""A watch through a connection that goes silent ends, so that the client can resume elsewhere.

A gateway's host lost or a network cut sends no reset: without keepalive the client's stream
waited for ever. The silence is a real TCP proxy between the SDK and the harness's gateway that
stops forwarding and closes nothing.
"""

from __future__ import annotations

from contextlib import aclosing

import anyio
import pytest

from fairgate import Client, JobBuilder, JobState, TokenDelta, Unavailable
from tests.gateway.backends.proxy import cuttable_proxy
from tests.gateway.conftest import Harness

pytestmark = pytest.mark.anyio


@pytest.mark.engine_step_s(0.01)
async def test_a_watch_through_a_silent_connection_ends_unavailable_then_resumes(
    harness: Harness,
) -> None:
    spec = JobBuilder("long").node("a", prompt="x", max_tokens=2000).build()
    key = harness.keys["alpha"]
    async with (
        cuttable_proxy(harness.gateway.port) as proxy,
        Client(f"127.0.0.1:{proxy.port}", key, keepalive_s=0.5, keepalive_timeout_s=0.5) as far,
        Client(harness.target, key) as near,
    ):
        job = await near.submit_job(spec)
        last = 0
        with pytest.raises(Unavailable):
            async with aclosing(far.watch_job(job.job_id)) as events:
                with anyio.fail_after(20):  # a keepalive's second or two; without it, never
                    async for event in events:
                        last = event.sequence
                        if isinstance(event, TokenDelta):
                            proxy.freeze()
        assert last > 0
        async with aclosing(near.watch_job(job.job_id, from_sequence=last + 1)) as resumed:
            first = await anext(resumed)
        assert first.sequence == last + 1
        assert (await near.cancel_job(job.job_id)).state is JobState.CANCELLED
