"""Two gateway replicas on one real Redis in front of one shared `fairgate engine serve` pool:
tenants of weights 1 and 2, each sending every job through a different replica, split the
saturated pool's KV token-time within 10 % of 1:2, as the pool's share across replicas grants
it; no reservation is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.replicas.share import WEIGHTS, measure_share
from tests.gateway.engine_servers import backend_of, engine_servers
from tests.reliability.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


async def test_two_replicas_split_a_saturated_pool_by_weight(
    redis: RedisServer, tmp_path: Path
) -> None:
    async with engine_servers(tmp_path, 1, step_s=0.005) as (server,):
        backend = backend_of(server, tmp_path, max_num_seqs=4)
        run = await measure_share(
            redis.url,
            [backend],
            tmp_path,
            per_replica=False,
            jobs_per_tenant=20,
            fanout=4,
            max_tokens=24,
            slack_calls=1.0,
        )
    assert run.calls == 2 * 20 * 4
    assert set(run.parts) == set(WEIGHTS)
    assert run.error <= 0.1, run
