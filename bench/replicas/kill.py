"""No accepted job lost: three replica processes, one killed with SIGKILL mid-run and restarted.

Three `fairgate serve` processes (`gateways.py`, redis store) before the given backends; three
tenants submit `jobs` chain jobs of three calls, spread over the replicas, and each job is
watched on the replica it was submitted to. Once a node of the first replica's jobs is done that
replica is killed (SIGKILL: no hand-over, its leases run out), and once one of its watchers has
resumed elsewhere it is started again on the same port and outbox file. A `Watcher` whose stream
breaks resumes on the next replica from its last sequence + 1. The run returns every watcher and,
once the dead replica's reservations have run out, each tenant's usage and the job leases left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import grpc
from redis.asyncio import Redis

from bench.replicas import ADMIN_KEY
from bench.replicas.gateways import GatewayReplica, running
from fairgate.v1 import admin_pb2, admin_pb2_grpc, gateway_pb2_grpc
from fairgate.v1 import gateway_pb2 as pb
from gateway.backends.settings import BackendSettings

TENANTS = ("t0", "t1", "t2")
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
Auth = tuple[tuple[str, str]]


class Watcher:
    """Watches one job from the replica it was submitted to; when that stream breaks, resumes on
    the next replica from the last sequence seen + 1."""

    def __init__(self, job_id: str, tenant: str, auth: Auth, first: int) -> None:
        self.job_id, self.tenant, self.auth, self.replica = job_id, tenant, auth, first
        self.events: list[pb.JobEvent] = []
        self.switches = 0

    async def watch(self, stubs: Sequence[gateway_pb2_grpc.GatewayStub]) -> None:
        while True:
            after = self.events[-1].sequence if self.events else 0
            request = pb.WatchJobRequest(job_id=self.job_id, from_sequence=after + 1)
            try:
                async for event in stubs[self.replica].WatchJob(request, metadata=self.auth):
                    self.events.append(event)
                    if event.WhichOneof("event") == "job_finished":
                        return
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                    raise
            self.replica = (self.replica + 1) % len(stubs)
            self.switches += 1

    @property
    def job(self) -> pb.Job | None:
        """The job as JobFinished gave it; None before."""
        if self.events and self.events[-1].WhichOneof("event") == "job_finished":
            return self.events[-1].job_finished.job
        return None

    def count(self, state: int, reason: str | None = None) -> int:
        """Node state changes seen to `state` (with `reason`, when given)."""
        return sum(
            e.WhichOneof("event") == "node_state_changed"
            and e.node_state_changed.node.state == state
            and (reason is None or e.node_state_changed.node.reason == reason)
            for e in self.events
        )


@dataclass(frozen=True, slots=True)
class KillRun:
    watchers: list[Watcher]
    doomed: list[Watcher]  # those that watched through the killed replica
    usage: dict[str, admin_pb2.Usage]  # tenant -> its usage, reservations run out
    open_leases: int  # jobs still owned under a lease
    # replica -> what it logged at WARNING or above, read once every replica has stopped
    warnings: dict[str, list[str]] = field(default_factory=dict)

    @property
    def lost_jobs(self) -> int:
        return sum(w.job is None or w.job.state != pb.JOB_STATE_SUCCEEDED for w in self.watchers)

    @property
    def duplicate_events(self) -> int:
        return sum(len(w.events) - len({e.sequence for e in w.events}) for w in self.watchers)

    @property
    def gaps(self) -> int:
        """Sequences missing below a watcher's last one."""
        return sum(
            max((e.sequence for e in w.events), default=0) - len({e.sequence for e in w.events})
            for w in self.watchers
        )


async def run_with_a_kill(
    redis_url: str, backends: Sequence[BackendSettings], directory: Path, jobs: int = 30
) -> KillRun:
    gateways = [GatewayReplica(f"r{i}", redis_url, directory, backends, SETTINGS) for i in range(3)]
    async with running(gateways):
        channels = [grpc.aio.insecure_channel(g.target) for g in gateways]
        try:
            run = await _drive(gateways, channels, jobs, redis_url)
        finally:
            for channel in channels:
                await channel.close()
    return dataclasses.replace(run, warnings={g.name: g.warnings() for g in gateways})


async def _drive(
    gateways: list[GatewayReplica], channels: list[grpc.aio.Channel], jobs: int, redis_url: str
) -> KillRun:
    stubs = [gateway_pb2_grpc.GatewayStub(c) for c in channels]
    admin = admin_pb2_grpc.AdminStub(channels[1])
    auth: dict[str, Auth] = {}
    for tenant in TENANTS:
        create = admin_pb2.CreateTenantRequest(tenant_id=tenant)
        await admin.CreateTenant(create, metadata=ADMIN_AUTH)
        issue = admin_pb2.IssueKeyRequest(tenant_id=tenant)
        issued = await admin.IssueKey(issue, metadata=ADMIN_AUTH)
        auth[tenant] = (("authorization", f"Bearer {issued.plaintext}"),)
    watchers = []
    for i in range(jobs):
        tenant, replica = TENANTS[i % 3], (i // 3) % 3
        request = pb.SubmitJobRequest(job=_chain(3, 32))
        job = await stubs[replica].SubmitJob(request, metadata=auth[tenant])
        watchers.append(Watcher(job.job_id, tenant, auth[tenant], replica))
    doomed = [w for w in watchers if w.replica == 0]
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for watcher in watchers:
                tg.start_soon(watcher.watch, stubs)
            while not any(w.count(pb.NODE_STATE_SUCCEEDED) for w in doomed):  # mid-run
                await anyio.sleep(0.05)
            gateways[0].kill()
            while not any(w.switches for w in doomed):
                await anyio.sleep(0.05)
            await anyio.to_thread.run_sync(gateways[0].start)
    usage = {tenant: await _usage_settled(admin, tenant) for tenant in TENANTS}
    async with Redis.from_url(redis_url) as client:
        open_leases = int(await client.zcard("fg:{jobs}:open"))
    return KillRun(watchers, doomed, usage, open_leases)


async def _usage_settled(admin: admin_pb2_grpc.AdminStub, tenant: str) -> admin_pb2.Usage:
    """The tenant's usage once no reservation is open (the dead replica's run out)."""
    request = admin_pb2.GetUsageRequest(tenant_id=tenant)
    with anyio.fail_after(15):
        while (usage := await admin.GetUsage(request, metadata=ADMIN_AUTH)).active_reservations:
            await anyio.sleep(0.2)
    return usage


def _chain(length: int, max_tokens: int) -> pb.JobSpec:
    sampling = pb.SamplingSpec(max_tokens=max_tokens)
    nodes = [pb.NodeSpec(id="n0", prompt_template="start", sampling=sampling)]
    for i in range(1, length):
        template, parent = f"go on from {{{{n{i - 1}.output}}}}", f"n{i - 1}"
        node = pb.NodeSpec(id=f"n{i}", prompt_template=template, depends_on=[parent])
        node.sampling.CopyFrom(sampling)
        nodes.append(node)
    return pb.JobSpec(nodes=nodes)
