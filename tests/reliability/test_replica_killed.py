"""No accepted job lost: three `fairgate serve` replicas on one real redis-server (AOF on) in
front of two `fairgate engine serve` processes; three tenants submit 30 jobs spread over the
replicas and watch them where they submitted them; one replica is killed with SIGKILL mid-run
and later started again. Every job succeeds; a watcher whose stream broke with the dead replica
resumes on another from its last sequence + 1 and sees every event once, in order; usage is the
settled attempts (the finished nodes, plus at most one attempt of each node the dead replica's
jobs ran again), and no reservation, admitted job or job lease is left."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import grpc
import pytest
from redis.asyncio import Redis

from bench.replicas.gateways import GatewayReplica
from fairgate.v1 import admin_pb2, admin_pb2_grpc, gateway_pb2_grpc
from fairgate.v1 import gateway_pb2 as pb
from gateway.backends.settings import BackendSettings
from tests.gateway.conftest import ADMIN_KEY
from tests.gateway.engine_servers import backend_of, engine_servers
from tests.reliability.redis_server import RedisServer
from tests.reliability.test_redis_outage import chain

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
TENANTS = ("t0", "t1", "t2")
JOBS = 30
DONE = (pb.NODE_STATE_SUCCEEDED, pb.NODE_STATE_CAPPED)
RERUN = "backend lost with its replica: running again"
SETTINGS = {
    "admin_key": ADMIN_KEY,
    "lease_ttl_s": "1.5",  # a dead replica's jobs are taken over within 2 s
    "reservation_ttl_s": "3",  # and what it had reserved returns within 3 s
    "grace_s": "0.2",
    "policy": "justitia",
}
ADMIN_AUTH = (("authorization", f"Bearer {ADMIN_KEY}"),)


@contextmanager
def replicas(
    redis: RedisServer, tmp_path: Path, backends: list[BackendSettings]
) -> Iterator[list[GatewayReplica]]:
    started = [GatewayReplica(f"r{i}", redis.url, tmp_path, backends, SETTINGS) for i in range(3)]
    try:
        yield started
    finally:
        for replica in started:
            replica.stop()


class Watcher:
    """Watches one job from the replica it was submitted to; when that stream breaks, resumes on
    the next replica from the last sequence seen + 1."""

    def __init__(self, job_id: str, auth: tuple[tuple[str, str]], first: int) -> None:
        self.job_id, self.auth, self.replica = job_id, auth, first
        self.events: list[pb.JobEvent] = []
        self.switches = 0

    async def watch(self, stubs: list[gateway_pb2_grpc.GatewayStub]) -> None:
        while True:
            after = self.events[-1].sequence if self.events else 0
            request = pb.WatchJobRequest(job_id=self.job_id, from_sequence=after + 1)
            try:
                async for event in stubs[self.replica].WatchJob(request, metadata=self.auth):
                    self.events.append(event)
                    if event.WhichOneof("event") == "job_finished":
                        return
            except grpc.aio.AioRpcError as exc:
                assert exc.code() is grpc.StatusCode.UNAVAILABLE, exc
            self.replica = (self.replica + 1) % len(stubs)
            self.switches += 1

    @property
    def reruns(self) -> int:
        return sum(
            e.WhichOneof("event") == "node_state_changed"
            and e.node_state_changed.node.state == pb.NODE_STATE_READY
            and e.node_state_changed.node.reason == RERUN
            for e in self.events
        )


async def test_a_killed_replica_loses_no_job(redis: RedisServer, tmp_path: Path) -> None:
    async with engine_servers(tmp_path, 2, step_s=0.02) as servers:
        backends = [backend_of(s, tmp_path) for s in servers]
        with replicas(redis, tmp_path, backends) as gateways:
            async with anyio.create_task_group() as tg:
                for replica in gateways:
                    tg.start_soon(anyio.to_thread.run_sync, replica.start)
            channels = [grpc.aio.insecure_channel(g.target) for g in gateways]
            stubs = [gateway_pb2_grpc.GatewayStub(c) for c in channels]
            admin = admin_pb2_grpc.AdminStub(channels[1])
            try:
                auth = {}
                for tenant in TENANTS:
                    await admin.CreateTenant(
                        admin_pb2.CreateTenantRequest(tenant_id=tenant), metadata=ADMIN_AUTH
                    )
                    issued = await admin.IssueKey(
                        admin_pb2.IssueKeyRequest(tenant_id=tenant), metadata=ADMIN_AUTH
                    )
                    auth[tenant] = (("authorization", f"Bearer {issued.plaintext}"),)
                watchers: list[Watcher] = []
                for i in range(JOBS):
                    tenant, replica = TENANTS[i % 3], (i // 3) % 3
                    request = pb.SubmitJobRequest(job=chain(3, 32))
                    job = await stubs[replica].SubmitJob(request, metadata=auth[tenant])
                    watchers.append(Watcher(job.job_id, auth[tenant], replica))
                with anyio.fail_after(90):
                    async with anyio.create_task_group() as tg:
                        for watcher in watchers:
                            tg.start_soon(watcher.watch, stubs)
                        doomed = [w for w in watchers if w.replica == 0]
                        while not any(_done_nodes(w) for w in doomed):  # mid-run
                            await anyio.sleep(0.05)
                        gateways[0].kill()
                        while not any(w.switches for w in doomed):
                            await anyio.sleep(0.05)
                        await anyio.to_thread.run_sync(gateways[0].start)
                for watcher in watchers:
                    sequences = [e.sequence for e in watcher.events]
                    assert sequences == list(range(1, len(sequences) + 1)), watcher.job_id
                    last = watcher.events[-1].job_finished.job
                    assert last.state == pb.JOB_STATE_SUCCEEDED, (watcher.job_id, last)
                assert all(w.switches for w in doomed)  # their streams broke with r0
                assert not any(w.switches for w in watchers if w not in doomed)
                await _settled(admin, watchers, auth)
            finally:
                for channel in channels:
                    await channel.close()
    async with Redis.from_url(redis.url) as client:
        assert await client.zcard("fg:{jobs}:open") == 0  # no job lease left


def _done_nodes(watcher: Watcher) -> int:
    return sum(
        e.WhichOneof("event") == "node_state_changed" and e.node_state_changed.node.state in DONE
        for e in watcher.events
    )


async def _settled(
    admin: admin_pb2_grpc.AdminStub,
    watchers: list[Watcher],
    auth: dict[str, tuple[tuple[str, str]]],
) -> None:
    """Each tenant's usage once the dead replica's reservations have run out."""
    for tenant, key in auth.items():
        mine = [w for w in watchers if w.auth == key]
        finished = [n for w in mine for n in w.events[-1].job_finished.job.nodes if n.state in DONE]
        reruns = sum(w.reruns for w in mine)
        request = admin_pb2.GetUsageRequest(tenant_id=tenant)
        with anyio.fail_after(15):
            while (usage := await admin.GetUsage(request, metadata=ADMIN_AUTH)).active_reservations:
                await anyio.sleep(0.2)
        assert usage.queued_jobs == 0, usage
        assert len(finished) <= usage.settled_calls <= len(finished) + reruns, (tenant, usage)
        assert usage.input_tokens >= sum(n.prompt_tokens for n in finished)
        assert usage.output_tokens >= sum(n.output_tokens for n in finished)
