"""Quotas that never fail open and never stall others: leases renewed while calls run, a slow
store reply holding up only its own tenant, an admitted job's slot freed one lease after a crash."""

from __future__ import annotations

from typing import Any

import anyio
import grpc
import pytest

from fairgate.v1 import gateway_pb2 as pb
from gateway.gateway_protos import job_spec_from_proto
from gateway.job_run import JobRun
from tenants import MemoryQuotaStore, Reservation
from tests.fake_clock import FakeClock
from tests.gateway.conftest import sim_core
from tests.reliability.harness import reliable_gateway, roots

pytestmark = pytest.mark.anyio


class GatedStore(MemoryQuotaStore):
    """The in-memory store, with one tenant's reserves or admissions held at a gate: a Redis
    reply that takes as long as the test wants."""

    def __init__(self, gated: str = "", step: str = "", clock: FakeClock | None = None) -> None:
        if clock is None:
            super().__init__()
        else:
            super().__init__(clock)
        self.gated, self.step = gated, step
        self.gate = anyio.Event()
        self.waiting = anyio.Event()

    async def _pass(self, tenant_id: str, step: str) -> None:
        if (tenant_id, step) == (self.gated, self.step) and not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()

    async def reserve(self, tenant_id: str, call_id: str, tokens: int, ttl_s: float) -> Reservation:
        await self._pass(tenant_id, "reserve")
        return await super().reserve(tenant_id, call_id, tokens, ttl_s)

    async def admit_job(
        self, tenant_id: str, job_id: str, num_nodes: int, *, ttl_s: float = 3600.0
    ) -> bool:
        await self._pass(tenant_id, "admission")
        return await super().admit_job(tenant_id, job_id, num_nodes, ttl_s=ttl_s)


async def test_a_call_running_past_its_lease_keeps_its_reservation() -> None:
    # 80 steps of 50 ms: the call runs 4 s under a 1.5 s lease, renewed every 0.5 s
    async with reliable_gateway(core=sim_core(0.05), reservation_ttl_s=1.5) as h:
        await h.tenant("long")
        job = await h.submit("long", roots(1, 80))
        await anyio.sleep(3.0)  # two leases later
        usage = await h.usage("long")
        assert usage.active_reservations == 1 and usage.queued_jobs == 1  # renewed, not reclaimed
        await h.finished("long", job.job_id)
        await h.unharmed()
        assert (await h.usage("long")).output_tokens == 80


@pytest.mark.parametrize("step", ["reserve", "admission"])
async def test_a_slow_store_reply_holds_up_only_its_own_tenant(step: str) -> None:
    store = GatedStore("stuck", step)
    async with reliable_gateway(store=store) as h:
        await h.tenant("stuck")
        if step == "reserve":
            job = await h.submit("stuck", roots(2))  # admitted; its reserves wait at the gate
            await store.waiting.wait()
            await h.serving()  # other tenants' jobs run meanwhile
            store.gate.set()
            assert (await h.finished("stuck", job.job_id)).state == pb.JOB_STATE_SUCCEEDED
        else:
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.submit, "stuck", roots(2))
                await store.waiting.wait()  # its admission waits at the gate
                await h.serving()  # no lock of the stuck tenant's holds up anyone else
                store.gate.set()
        await h.unharmed()


async def test_an_admitted_job_holds_its_slot_for_one_lease_after_a_crash() -> None:
    clock = FakeClock()
    store = GatedStore(clock=clock)
    async with reliable_gateway(store=store, reservation_ttl_s=5.0) as h:
        await h.tenant("crashy", max_queued_jobs=1)
        tenant = await h.gateway.store.get_tenant("crashy")
        run = JobRun("job-lost", "crashy", job_spec_from_proto(roots(1)), clock())
        await h.gateway.dispatcher.admit(run, tenant.quota)  # admitted, then the gateway died
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.submit("crashy", roots(1))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        clock.advance(5.0)  # one lease: nobody renewed it
        job = await h.submit("crashy", roots(1))
        assert (await h.finished("crashy", job.job_id)).state == pb.JOB_STATE_SUCCEEDED
        await h.unharmed()


class ReplyHeld(MemoryQuotaStore):
    """The in-memory store whose admissions land but whose replies never come back: a client
    leaving meanwhile is the one to undo them."""

    def __init__(self) -> None:
        super().__init__()
        self.landed, self.finished = anyio.Event(), anyio.Event()

    async def _held(self) -> None:
        self.landed.set()
        await anyio.sleep_forever()

    async def admit_job(
        self, tenant_id: str, job_id: str, num_nodes: int, *, ttl_s: float = 3600.0
    ) -> bool:
        await super().admit_job(tenant_id, job_id, num_nodes, ttl_s=ttl_s)
        await self._held()
        raise AssertionError("unreachable")

    async def admit_job_and_reserve(self, *args: Any, **kwargs: Any) -> Reservation | None:
        await super().admit_job_and_reserve(*args, **kwargs)
        await self._held()
        raise AssertionError("unreachable")

    async def finish_job(self, tenant_id: str, job_id: str) -> bool:
        try:
            return await super().finish_job(tenant_id, job_id)
        finally:
            self.finished.set()


@pytest.mark.parametrize("rpc", ["SubmitJob", "RunJob"])
async def test_a_client_gone_while_its_job_is_admitted_leaves_nothing_admitted(rpc: str) -> None:
    """Its admission ran in the store, its reply on the way: the job was not undone and held
    the tenant's queued-job slot (a one-call job its reservation too) for a whole lease."""
    store = ReplyHeld()
    async with reliable_gateway(store=store) as h:
        await h.tenant("acme", max_queued_jobs=1)
        call = getattr(h.stub, rpc)(pb.SubmitJobRequest(job=roots(1)), metadata=h.auth("acme"))
        with anyio.fail_after(5):
            await store.landed.wait()
        call.cancel()  # the client goes away
        with anyio.fail_after(5):
            await store.finished.wait()
        usage = await h.usage("acme")
        assert (usage.queued_jobs, usage.active_reservations) == (0, 0)
