"""A client that goes silent loses its streams: the gateway pings it and closes the connection.

A client's host lost or a network cut sends no reset: without the gateway's own keepalive, a
RunJob from such a client ran on, holding its stream and its tenant's slots, for ever. The
silence is a real TCP proxy between the SDK and the gateway that stops forwarding and closes
nothing.
"""

from __future__ import annotations

from contextlib import aclosing

import anyio
import pytest

from fairgate import Client, JobBuilder, JobFinished, JobState, TokenDelta
from tests.gateway.backends.proxy import cuttable_proxy
from tests.gateway.conftest import sim_core
from tests.reliability.harness import reliable_gateway

pytestmark = pytest.mark.anyio


async def test_a_run_job_whose_client_went_silent_is_cancelled_within_the_keepalive() -> None:
    spec = JobBuilder("long").node("a", prompt="x", max_tokens=2000).build()
    async with reliable_gateway(core=sim_core(0.01), keepalive_s=0.5, keepalive_timeout_s=0.5) as h:
        key = await h.tenant("a", max_tokens_ceiling=2000)
        async with (
            cuttable_proxy(h.gateway.port) as proxy,
            # the client's own keepalive would end its side first: this one waits for ever
            Client(f"127.0.0.1:{proxy.port}", key, keepalive_s=3600) as far,
            Client(f"127.0.0.1:{h.gateway.port}", key) as near,
        ):
            async with aclosing(far.run_job(spec)) as running:
                async for event in running:
                    if isinstance(event, TokenDelta):
                        job_id = event.job_id
                        proxy.freeze()
                        break
                async with aclosing(near.watch_job(job_id)) as watched:
                    with anyio.fail_after(20):  # a keepalive's second or two; without it, never
                        finished = [e async for e in watched if isinstance(e, JobFinished)]
            assert finished[0].job.state is JobState.CANCELLED
