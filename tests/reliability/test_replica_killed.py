"""No accepted job lost (bench/replicas/kill.py, real processes): three `fairgate serve`
replicas on one real redis-server (AOF on) in front of two `fairgate engine serve` processes;
three tenants submit 30 jobs spread over the replicas and watch them where they submitted them;
one replica is killed with SIGKILL mid-run and later started again. Every job succeeds; a
watcher whose stream broke with the dead replica resumes on another from its last sequence + 1
and sees every event once, in order; usage is the settled attempts (the finished nodes, plus at
most one attempt of each node the dead replica's jobs ran again), and no reservation, admitted
job or job lease is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.replicas.kill import DONE, RERUN, run_with_a_kill
from fairgate.v1 import gateway_pb2 as pb
from tests.gateway.engine_servers import backend_of, engine_servers
from tests.reliability.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


async def test_a_killed_replica_loses_no_job(redis: RedisServer, tmp_path: Path) -> None:
    async with engine_servers(tmp_path, 2, step_s=0.02) as servers:
        backends = [backend_of(s, tmp_path) for s in servers]
        run = await run_with_a_kill(redis.url, backends, tmp_path, jobs=30)
    lost = [
        (
            w.job_id,
            w.switches,
            None if w.job is None else (w.job.state, [n.reason for n in w.job.nodes]),
        )
        for w in run.watchers
        if w.job is None or w.job.state != pb.JOB_STATE_SUCCEEDED
    ]
    assert (run.lost_jobs, run.duplicate_events, run.gaps) == (0, 0, 0), (lost, run.warnings)
    for watcher in run.watchers:
        sequences = [e.sequence for e in watcher.events]
        assert sequences == list(range(1, len(sequences) + 1)), watcher.job_id
    assert run.doomed and all(w.switches for w in run.doomed)  # they broke with r0
    assert not any(w.switches for w in run.watchers if w not in run.doomed)
    assert sum(w.count(pb.NODE_STATE_READY, RERUN) for w in run.doomed) > 0  # ran again
    for tenant, usage in run.usage.items():
        mine = [w for w in run.watchers if w.tenant == tenant]
        finished = [n for w in mine if w.job is not None for n in w.job.nodes if n.state in DONE]
        reruns = sum(w.count(pb.NODE_STATE_READY, RERUN) for w in mine)
        assert (usage.active_reservations, usage.queued_jobs) == (0, 0), usage
        assert len(finished) <= usage.settled_calls <= len(finished) + reruns, (tenant, usage)
        assert usage.input_tokens >= sum(n.prompt_tokens for n in finished)
        assert usage.output_tokens >= sum(n.output_tokens for n in finished)
    assert run.open_leases == 0
