"""Yields through the dispatcher (`share_slots`) on a remote backend driven by hand: who gets
the slot a yield frees, and a yield that comes after the call's answer is whole."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import anyio
import pytest
from anyio.streams.memory import MemoryObjectSendStream

from engine import FinishReason, TokenDelta
from gateway.backends.base import BackendCall, BackendCapacity, Capabilities
from gateway.backends.call_stream import CallControl, Item, RemoteCallStream
from gateway.calls import CallDefaults, CallPlanner
from gateway.dispatch import DispatchConfig, Dispatcher
from gateway.job_run import JobRun, NodeChanged, NodeState
from gateway.jobs.model import JobSpec, SamplingSpec
from gateway.lanes import make_lane
from gateway.metrics import GatewayMetrics
from gateway.server import LENGTH_PRIOR
from predictor.anomaly import AnomalyGuard
from predictor.history import HistoryPredictor
from tenants import MemoryQuotaStore, TenantQuota
from tenants.policies import make_policy
from tests.fake_clock import FakeClock
from tests.gateway.conftest import byte_tokenizer
from tests.gateway.jobs.factories import make_node

pytestmark = pytest.mark.anyio
QUOTA = TenantQuota(max_tokens_ceiling=2048)


class _Control(CallControl):
    """A call's control whose task ends as soon as it is aborted."""

    def __init__(self, call_id: str, backend: HandRemote) -> None:
        super().__init__(call_id)
        self.backend = backend

    def abort(self) -> None:
        super().abort()
        self.backend.end(self.call_id)


class HandRemote:
    """A remote backend as `OpenAIBackend` drives one: each call's deltas go through a memory
    stream into the real `RemoteCallStream`, sent by the test; a call holds a slot until its
    task ends."""

    def __init__(self, slots: int) -> None:
        self.name, self.model, self.slots = "remote", "sim", slots
        self.capabilities = Capabilities(hidden_states=False, priority=False, shared=False)
        self.live: dict[str, tuple[CallControl, MemoryObjectSendStream[Item]]] = {}
        self.submitted: list[str] = []
        self.aborted: list[str] = []

    def capacity(self) -> BackendCapacity:
        busy = len(self.live)
        return BackendCapacity(10_000, 16, self.slots - busy, busy, 0, True)

    def down_for(self) -> float | None:
        return None

    def submit(self, call: BackendCall) -> RemoteCallStream:
        control = _Control(call.call_id, self)
        send, receive = anyio.create_memory_object_stream[Item](math.inf)
        self.live[call.call_id] = (control, send)
        self.submitted.append(call.call_id)
        return RemoteCallStream(control, receive)

    def abort(self, call_id: str) -> None:
        if call_id in self.live:
            self.aborted.append(call_id)
            self.live[call_id][0].abort()

    def end(self, call_id: str) -> None:
        entry = self.live.pop(call_id, None)
        if entry is not None:
            entry[1].close()
            entry[0].ended.set()

    def send(self, call_id: str, text: str, finished: bool = False) -> None:
        reason = FinishReason.STOP if finished else None
        self.live[call_id][1].send_nowait(
            TokenDelta(call_id, [7] * len(text), text, finished, reason)
        )

    def set_priority(self, call_id: str, priority: float) -> None:
        pass

    def set_prediction(self, call_id: str, predicted_output: int) -> None:
        pass


def dispatcher(
    backend: HandRemote,
    store: MemoryQuotaStore,
    clock: Callable[[], float] = time.time,
    knee_calls: int | None = None,
) -> Dispatcher:
    planner = CallPlanner(
        HistoryPredictor(LENGTH_PRIOR), AnomalyGuard(), CallDefaults(), None, None
    )
    policy = make_policy("fcfs")
    lane = make_lane(
        "sim", [backend], byte_tokenizer(), policy, planner, knee_calls, share_slots=True
    )
    return Dispatcher([lane], store, planner, DispatchConfig(), clock=clock)


def job(job_id: str, tenant: str, *nodes: str, created_at: float | None = None) -> JobRun:
    sampling = SamplingSpec(max_tokens=8)
    spec = JobSpec(nodes=tuple(make_node(n, f"say {n}", sampling=sampling) for n in nodes))
    return JobRun(job_id, tenant, spec, time.time() if created_at is None else created_at)


async def submit(d: Dispatcher, store: MemoryQuotaStore, run: JobRun) -> None:
    quota = (await store.get_tenant(run.tenant_id)).quota
    d.submit(run, quota, await d.admit(run, quota))


def restarts(run: JobRun, node_id: str) -> list[str]:
    return [
        e.body.reason
        for e in run.events
        if isinstance(e.body, NodeChanged)
        and e.body.node_id == node_id
        and (e.body.previous, e.body.state) == (NodeState.RUNNING, NodeState.READY)
    ]


async def test_a_call_that_yields_with_its_answer_whole_in_hand_keeps_it() -> None:
    # the call's last chunks came in one read as the pass chose it to yield: its stream stopped
    # at the abort without its finished delta, and the node ran again from its prompt
    store = MemoryQuotaStore()
    for tenant in ("h", "l"):
        await store.create_tenant(tenant, tenant, QUOTA)
    backend = HandRemote(slots=2)
    async with dispatcher(backend, store) as d:
        heavy = job("H", "h", "a", "b")
        await submit(d, store, heavy)
        await anyio.wait_all_tasks_blocked()
        assert backend.submitted == ["H/a", "H/b"]
        light = job("L", "l", "x")
        await submit(d, store, light)  # a pass is due: l is under its share, h over it
        backend.send("H/b", "partial ")
        backend.send("H/b", "ANSWER", finished=True)  # buffered behind the first
        await anyio.wait_all_tasks_blocked()
        assert backend.aborted == ["H/b"]  # it did yield ...
        b = heavy.nodes["b"]  # ... too late: its answer stands
        assert b.state is NodeState.SUCCEEDED and b.output == "partial ANSWER"
        assert restarts(heavy, "b") == [] and "L/x" in backend.live
        d.cancel(heavy)
        d.cancel(light)


async def test_the_slot_a_share_yield_frees_is_not_taken_back_by_its_tenant() -> None:
    # the aborted attempt's release lifted h's concurrency hold at once: its held call, first
    # in fcfs's order, took the slot back from the call it had been given up for
    store = MemoryQuotaStore()
    two_calls = TenantQuota(max_tokens_ceiling=2048, max_concurrent_calls=2)
    await store.create_tenant("h", "h", two_calls)
    for tenant in ("m", "l"):
        await store.create_tenant(tenant, tenant, QUOTA)
    backend = HandRemote(slots=3)
    clock = FakeClock()  # frozen: h's hold never lapses on its own
    async with dispatcher(backend, store, clock) as d:
        heavy = job("H", "h", "a", "b", "c", created_at=clock())
        await submit(d, store, heavy)
        await anyio.wait_all_tasks_blocked()
        assert backend.submitted == ["H/a", "H/b"]  # H/c: refused, two calls at most
        mid = job("M", "m", "m", created_at=clock())
        await submit(d, store, mid)
        await anyio.wait_all_tasks_blocked()
        light = job("L", "l", "x", created_at=clock())
        await submit(d, store, light)
        await anyio.wait_all_tasks_blocked()
        assert backend.aborted == ["H/b"]  # one slot each: h yields one of its two to l
        assert sorted(backend.live) == ["H/a", "L/x", "M/m"]
        assert restarts(heavy, "b") != []  # H/b waits to run again
        for run in (heavy, mid, light):
            d.cancel(run)


async def test_a_call_that_kept_its_answer_is_not_counted_as_yielded() -> None:
    """A yield was counted as its abort went: a call whose answer had come keeps it, and the
    metric (calls that gave their slot away and ran again) counted one that never ran again."""
    store = MemoryQuotaStore()
    for tenant in ("h", "l"):
        await store.create_tenant(tenant, tenant, QUOTA)
    backend = HandRemote(slots=2)
    planner = CallPlanner(HistoryPredictor(LENGTH_PRIOR), AnomalyGuard(), CallDefaults(), None)
    lane = make_lane("sim", [backend], byte_tokenizer(), make_policy("fcfs"), planner,
                     share_slots=True)  # fmt: skip
    metrics = GatewayMetrics()
    async with Dispatcher([lane], store, planner, DispatchConfig(), metrics=metrics) as d:
        heavy = job("H", "h", "a", "b")
        await submit(d, store, heavy)
        await anyio.wait_all_tasks_blocked()
        light = job("L", "l", "x")
        await submit(d, store, light)  # l under its share: H/b is chosen to yield
        backend.send("H/b", "partial ")
        backend.send("H/b", "ANSWER", finished=True)  # its answer whole in the buffer
        await anyio.wait_all_tasks_blocked()
        b = heavy.nodes["b"]
        assert backend.aborted == ["H/b"]
        assert b.state is NodeState.SUCCEEDED and restarts(heavy, "b") == []
        yielded = metrics.registry.get_sample_value("fairgate_calls_yielded_total", {"tenant": "h"})
        d.cancel(heavy)
        d.cancel(light)
    assert not yielded, f"fairgate_calls_yielded_total{{tenant=h}} = {yielded}, no call ran again"


async def test_past_the_knee_the_heavy_tenant_s_newest_calls_yield_while_a_light_one_runs() -> None:
    store = MemoryQuotaStore()
    for tenant in ("h", "l"):
        await store.create_tenant(tenant, tenant, QUOTA)
    backend = HandRemote(slots=8)
    async with dispatcher(backend, store, knee_calls=4) as d:
        heavy = job("H", "h", *"abcdefgh")
        await submit(d, store, heavy)
        await anyio.wait_all_tasks_blocked()
        assert len(backend.live) == 8  # alone, it has the whole batch
        light = job("L", "l", "x")
        await submit(d, store, light)
        await anyio.wait_all_tasks_blocked()
        # back to the knee (4) with the light call in it: the heavy job's 5 newest yield
        assert backend.aborted == [f"H/{n}" for n in "hgfed"]
        assert sorted(backend.live) == ["H/a", "H/b", "H/c", "L/x"]
        assert all(restarts(heavy, n) for n in "defgh")
        backend.send("L/x", "done", finished=True)
        backend.end("L/x")
        await anyio.wait_all_tasks_blocked()
        # the light tenant has nothing left: the heavy calls fill the batch again
        assert light.nodes["x"].state is NodeState.SUCCEEDED
        assert sorted(backend.live) == [f"H/{n}" for n in "abcdefgh"]
        d.cancel(heavy)
