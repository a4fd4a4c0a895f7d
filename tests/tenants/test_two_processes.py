"""Two gateway processes on one Redis never exceed a tenant's token rate by more than one call.

The test drains the tenant's bucket, then two OS processes (two tasks each) reserve and settle
fixed-size calls as fast as they can for WORK_S seconds. Redis TIME stamps every grant
(`expires_at - ttl`), so the bound is read on Redis's clock: after the drain at t0, the tokens
granted up to the last grant t1 are at most `rate * (t1 - t0) / 60 + one call`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from tenants import QuotaExceeded, RedisQuotaStore, TenantQuota
from tests.tenants.conftest import REDIS_URL

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
RATE = 60_000  # tokens per minute: 1000 per second
CALL_TOKENS = 50
TTL_S = 30.0
WORK_S = 2.0
TASKS_PER_PROCESS = 2


async def hammer(prefix: str) -> dict[str, object]:
    """One gateway process: reserve and settle calls until WORK_S has passed."""
    grants: list[float] = []
    refusals = 0
    deadline = time.monotonic() + WORK_S

    async def calls(store: RedisQuotaStore) -> None:
        nonlocal refusals
        while time.monotonic() < deadline:
            call_id = uuid.uuid4().hex
            try:
                reservation = await store.reserve("acme", call_id, CALL_TOKENS, TTL_S)
            except QuotaExceeded:
                refusals += 1
                await anyio.lowlevel.checkpoint()
                continue
            grants.append(reservation.expires_at - TTL_S)
            assert await store.settle("acme", call_id, CALL_TOKENS, 0)

    async with RedisQuotaStore(REDIS_URL, prefix=prefix) as store, anyio.create_task_group() as tg:
        for _ in range(TASKS_PER_PROCESS):
            tg.start_soon(calls, store)
    return {"grants": grants, "refusals": refusals}


def worker_main() -> None:
    """Entry point of a worker process: argv[1] is the key prefix; starts on a line on stdin."""
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(anyio.run(hammer, sys.argv[1])), flush=True)


def start_worker(prefix: str) -> subprocess.Popen[str]:
    code = "from tests.tenants.test_two_processes import worker_main; worker_main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, prefix],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def drain(prefix: str) -> float:
    """Create the tenant and empty its bucket; Redis time of the drain."""
    async with RedisQuotaStore(REDIS_URL, prefix=prefix) as store:
        await store.create_tenant("acme", "Acme", TenantQuota(tokens_per_minute=RATE))
        reservation = await store.reserve("acme", "drain", RATE, TTL_S)
        assert await store.settle("acme", "drain", RATE, 0)
        return reservation.expires_at - TTL_S


def test_two_processes_share_one_token_rate(redis_prefix: str) -> None:
    workers = [start_worker(redis_prefix) for _ in range(2)]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        drained_at = anyio.run(drain, redis_prefix)
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        results = [json.loads(worker.communicate(timeout=60)[0]) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    assert all(worker.returncode == 0 for worker in workers)

    grants = sorted(t for result in results for t in result["grants"])
    assert all(result["grants"] for result in results), "both processes got calls through"
    assert all(result["refusals"] > 0 for result in results), "the rate limit was reached"
    granted = len(grants) * CALL_TOKENS
    allowed = RATE * (grants[-1] - drained_at) / 60
    assert granted <= allowed + CALL_TOKENS
    assert granted >= allowed / 2, "the processes kept the bucket busy"
