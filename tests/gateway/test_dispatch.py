"""The dispatch loop against a real engine core (simulated runner) and the in-memory store."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import anyio
import pytest

from engine import AsyncEngine
from gateway.calls import CallDefaults, CallPlanner
from gateway.dispatch import DispatchConfig, Dispatcher
from gateway.job_run import JobRun, NodeChanged, NodeState, TokensAdded
from gateway.jobs.model import JobSpec, SamplingSpec
from gateway.server import LENGTH_PRIOR
from predictor.anomaly import AnomalyGuard
from predictor.history import HistoryPredictor
from tenants import MemoryQuotaStore, TenantQuota
from tenants.policies import make_policy
from tests.gateway.conftest import sim_core
from tests.gateway.jobs.factories import make_node

pytestmark = pytest.mark.anyio
QUOTA = TenantQuota(max_tokens_ceiling=2048)


class CountingStore(MemoryQuotaStore):
    """Records the calls that close jobs and calls, to count the store's round trips."""

    def __init__(self) -> None:
        super().__init__()
        self.closing: list[tuple[str, str]] = []

    async def settle(
        self,
        tenant_id: str,
        call_id: str,
        input_tokens: int,
        output_tokens: int,
        *,
        finish_job: str | None = None,
    ) -> bool:
        self.closing.append(("settle", finish_job or ""))
        return await super().settle(
            tenant_id, call_id, input_tokens, output_tokens, finish_job=finish_job
        )

    async def finish_job(self, tenant_id: str, job_id: str) -> bool:
        self.closing.append(("finish_job", job_id))
        return await super().finish_job(tenant_id, job_id)


@dataclass
class Env:
    engine: AsyncEngine
    dispatcher: Dispatcher


MakeEnv = Callable[..., Awaitable[Env]]


@pytest.fixture
async def make_env() -> AsyncIterator[MakeEnv]:
    """Builds a dispatcher over an engine whose instant steps run on the event loop (or that
    never steps, so that every call it is given waits); both are closed after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(store: MemoryQuotaStore, num_blocks: int = 4096, steps: bool = True) -> Env:
            engine = AsyncEngine(sim_core(num_blocks=num_blocks), run_in_thread=False)
            if steps:
                await stack.enter_async_context(engine)
            await store.create_tenant("acme", "Acme", QUOTA)
            planner = CallPlanner(HistoryPredictor(LENGTH_PRIOR), AnomalyGuard(), CallDefaults())
            dispatcher = Dispatcher(
                engine,
                make_policy("justitia"),
                store,
                engine.core.tokenizer,
                planner,
                DispatchConfig("sim"),
            )
            return Env(engine, await stack.enter_async_context(dispatcher))

        yield make


def job(job_id: str, *nodes: tuple[str, int]) -> JobRun:
    spec = JobSpec(
        nodes=tuple(make_node(n, f"say {n}", sampling=SamplingSpec(max_tokens=m)) for n, m in nodes)
    )
    return JobRun(job_id, "acme", spec, time.time())


async def test_room_counts_the_output_that_waiting_calls_will_reserve(make_env: MakeEnv) -> None:
    # 32 blocks of 16 tokens; a call's prompt takes 1 block, its reservation 20 more (the prior's
    # p90, 320 tokens). The engine does not step, so every dispatched call waits in it.
    env = await make_env(MemoryQuotaStore(), num_blocks=32, steps=False)
    engine, dispatcher = env.engine, env.dispatcher
    for i in range(3):
        dispatcher.submit(job(f"j{i}", ("a", 1000)), QUOTA)
    await anyio.wait_all_tasks_blocked()
    waiting = engine.core.scheduler.waiting
    assert [r.request_id for r in waiting] == ["j0/a"]  # by prompts alone all three fitted
    assert len(dispatcher.tickets) == 2


async def test_engine_priorities_follow_the_policys_rekeys(make_env: MakeEnv) -> None:
    env = await make_env(MemoryQuotaStore())
    engine, dispatcher = env.engine, env.dispatcher
    run = job("j", ("short", 2), ("long", 600))
    dispatcher.submit(run, QUOTA)
    requests = engine.core.scheduler.requests
    seen: list[float] = []

    def check() -> None:  # the engine holds the policy's current priority for "long"
        priority = dispatcher.policy.priority("j/long")
        assert requests["j/long"].priority == priority
        if not seen or seen[-1] != priority:
            seen.append(priority)

    produced = 0
    predicted = LENGTH_PRIOR.mean
    async for event in run.watch():
        body = event.body
        if isinstance(body, NodeChanged) and body.state is NodeState.SUCCEEDED:
            if body.node_id == "short":
                check()  # re-keyed with the short call's true length
        elif isinstance(body, TokensAdded) and body.node_id == "long":
            produced += len(body.token_ids)
            if produced in (1, predicted + 5, predicted + 50) and requests.get("j/long"):
                check()  # past its prediction the excess is charged as it runs
    assert len(seen) >= 3, seen


async def test_a_jobs_last_settle_finishes_the_job(make_env: MakeEnv) -> None:
    store = CountingStore()
    env = await make_env(store)
    engine, dispatcher = env.engine, env.dispatcher
    runs = [job("single", ("a", 3)), job("pair", ("a", 3), ("b", 5))]
    for run in runs:
        await store.admit_job("acme", run.job_id, len(run.nodes))
        dispatcher.submit(run, QUOTA)
    for run in runs:
        async for _ in run.watch():
            pass
    await anyio.wait_all_tasks_blocked()
    assert sorted(store.closing) == [
        ("settle", ""),
        ("settle", "pair"),
        ("settle", "single"),
    ]
    usage = await store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations, usage.settled_calls) == (0, 0, 3)
    assert not engine.core.scheduler.requests
