"""The dispatch loop against a real engine core (simulated runner) and the in-memory store."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis import Redis as SyncRedis

from engine import (
    AsyncEngine,
    LLMEngine,
    RequestStream,
    SamplingParams,
    SimulatedRunner,
    TokenDelta,
)
from gateway.backends import LocalBackend
from gateway.backends.base import BackendCall, BackendCapacity, CallStream, CallUsage
from gateway.calls import CallDefaults, CallPlan, CallPlanner
from gateway.dispatch import DispatchConfig, Dispatcher
from gateway.dispatch_core import PROGRESS_REKEY_S
from gateway.genai_metrics import GenAiMetrics
from gateway.job_run import JobRun, JobState, NodeChanged, NodeState, TokensAdded
from gateway.jobs.model import JobSpec, NodeSpec, SamplingSpec
from gateway.lanes import make_lane
from gateway.metrics import GatewayMetrics
from gateway.server import LENGTH_PRIOR
from gateway.share import RedisShare
from gateway.slo import SloConfig, SloTarget
from predictor.anomaly import AnomalyGuard
from predictor.base import CallFeatures
from predictor.error_tracker import ErrorTracker
from predictor.history import HistoryPredictor
from predictor.prompt_model import PromptModel
from tenants import MemoryQuotaStore, QuotaExceeded, QuotaLimit, Reservation, TenantQuota
from tenants.policies import FcfsPolicy, JobInfo, JustitiaPolicy, Policy, VtcPolicy
from tests.conftest import REDIS_URL
from tests.fake_clock import FakeClock
from tests.gateway.conftest import sim_core
from tests.gateway.factories import hidden_refiner
from tests.gateway.jobs.factories import make_node

pytestmark = pytest.mark.anyio
QUOTA = TenantQuota(max_tokens_ceiling=2048)


class CountingStore(MemoryQuotaStore):
    """Records the quota operations of jobs and calls: the store's round trips."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    async def admit_job(
        self, tenant_id: str, job_id: str, num_nodes: int, *, ttl_s: float = 3600.0
    ) -> bool:
        self.ops.append("admit_job")
        return await super().admit_job(tenant_id, job_id, num_nodes, ttl_s=ttl_s)

    async def admit_job_and_reserve(
        self,
        tenant_id: str,
        job_id: str,
        num_nodes: int,
        call_id: str,
        tokens: int,
        call_ttl_s: float,
        *,
        ttl_s: float = 3600.0,
    ) -> Reservation | None:
        self.ops.append("admit_job_and_reserve")
        return await super().admit_job_and_reserve(
            tenant_id, job_id, num_nodes, call_id, tokens, call_ttl_s, ttl_s=ttl_s
        )

    async def reserve(self, tenant_id: str, call_id: str, tokens: int, ttl_s: float) -> Reservation:
        self.ops.append("reserve")
        return await super().reserve(tenant_id, call_id, tokens, ttl_s)

    async def settle(
        self,
        tenant_id: str,
        call_id: str,
        input_tokens: int,
        output_tokens: int,
        *,
        finish_job: str | None = None,
    ) -> bool:
        self.ops.append(f"settle finishing {finish_job}" if finish_job else "settle")
        return await super().settle(
            tenant_id, call_id, input_tokens, output_tokens, finish_job=finish_job
        )

    async def release(self, tenant_id: str, call_id: str) -> bool:
        self.ops.append("release")
        return await super().release(tenant_id, call_id)

    async def finish_job(self, tenant_id: str, job_id: str) -> bool:
        self.ops.append("finish_job")
        return await super().finish_job(tenant_id, job_id)


class RecordingEngine(AsyncEngine):
    """The real async engine, noting the output each call reserves as it is sent, the refined
    predictions and the aborts it is told."""

    def __init__(self, core: LLMEngine) -> None:
        super().__init__(core, run_in_thread=False)
        self.reserved: dict[str, int | None] = {}
        self.predictions: list[tuple[str, int]] = []
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        super().abort(request_id)

    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams, **kwargs: Any
    ) -> RequestStream:
        self.reserved[kwargs["request_id"]] = kwargs.get("predicted_output_len")
        return super().add_request(prompt_token_ids, params, **kwargs)

    def set_prediction(self, request_id: str, predicted_output_len: int) -> None:
        self.predictions.append((request_id, predicted_output_len))
        super().set_prediction(request_id, predicted_output_len)


class RecordingJustitia(JustitiaPolicy):
    """Justitia, noting each refinement with the job's tag before and after it."""

    def __init__(self) -> None:
        super().__init__(pampered_jobs=1)
        self.refined: list[tuple[str, float, float, float]] = []

    def on_refined(self, call_id: str, predicted_output: float, now: float) -> None:
        job_id = call_id.split("/")[0]
        before = self.tag(job_id)
        super().on_refined(call_id, predicted_output, now)
        self.refined.append((call_id, predicted_output, before, self.tag(job_id)))


@dataclass
class Tally:
    """How often a step of the planner ran, and whether it has yet."""

    count: int = 0
    first: anyio.Event = field(default_factory=anyio.Event)

    def add(self) -> None:
        self.count += 1
        self.first.set()


class RecordingFcfs(FcfsPolicy):
    """First come, first served, noting each prediction it is told again of a call."""

    def __init__(self) -> None:
        super().__init__()
        self.refined: list[tuple[str, float]] = []

    def on_refined(self, call_id: str, predicted_output: float, now: float) -> None:
        super().on_refined(call_id, predicted_output, now)
        self.refined.append((call_id, predicted_output))


class RecordingPlanner(CallPlanner):
    """The real planner, noting when each call is counted past its p90 while it runs, and
    counting the nodes it predicts as their jobs arrive and the calls it plans."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.overruns: list[tuple[str, int]] = []  # (error tracker key, tokens so far)
        self.arrivals = Tally()  # nodes costed on their job's arrival
        self.plans = Tally()  # calls planned

    def expected_output(self, features: CallFeatures) -> float:
        self.arrivals.add()
        return super().expected_output(features)

    def plan(self, *args: Any, **kwargs: Any) -> CallPlan:
        self.plans.add()
        return super().plan(*args, **kwargs)

    def overran(self, plan: CallPlan, produced: int) -> bool:
        self.overruns.append((self.tracker_key(plan.features), produced))
        return super().overran(plan, produced)


@dataclass
class Env:
    engine: RecordingEngine
    dispatcher: Dispatcher


MakeEnv = Callable[..., Awaitable[Env]]


@pytest.fixture
async def make_env() -> AsyncIterator[MakeEnv]:
    """Builds a dispatcher over an engine whose instant steps run on the event loop (or that
    never steps, so that every call it is given waits); both are closed after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(
            store: MemoryQuotaStore,
            num_blocks: int = 4096,
            steps: bool = True,
            max_num_seqs: int = 128,
            knee_calls: int | None = None,
            refiner: PromptModel | None = None,
            tracker: ErrorTracker | None = None,
            policy: Policy | None = None,
            share: RedisShare | None = None,
            dispatcher_type: type[Dispatcher] = Dispatcher,
            clock: Callable[[], float] | None = None,
        ) -> Env:
            hidden_size = 0 if refiner is None else refiner.hidden_size
            core = sim_core(
                num_blocks=num_blocks, hidden_size=hidden_size, max_num_seqs=max_num_seqs
            )
            engine = RecordingEngine(core)
            if steps:
                await stack.enter_async_context(engine)
            await store.create_tenant("acme", "Acme", QUOTA)
            history = HistoryPredictor(LENGTH_PRIOR)
            planner = RecordingPlanner(history, AnomalyGuard(), CallDefaults(), refiner, tracker)
            backends = [LocalBackend(engine, "sim")]
            tokenizer = engine.core.tokenizer
            policy = policy if policy is not None else RecordingJustitia()
            gated = share is not None  # a pool shared with other replicas
            lane = make_lane("sim", backends, tokenizer, policy, planner, knee_calls, gated=gated)
            config = DispatchConfig()
            timed = {} if clock is None else {"clock": clock}
            dispatcher = dispatcher_type([lane], store, planner, config, share=share, **timed)
            return Env(engine, await stack.enter_async_context(dispatcher))

        yield make


def job(job_id: str, *nodes: tuple[str, int], created_at: float | None = None) -> JobRun:
    spec = JobSpec(
        nodes=tuple(make_node(n, f"say {n}", sampling=SamplingSpec(max_tokens=m)) for n, m in nodes)
    )
    return JobRun(job_id, "acme", spec, time.time() if created_at is None else created_at)


async def test_room_counts_the_output_that_waiting_calls_will_reserve(make_env: MakeEnv) -> None:
    # 32 blocks of 16 tokens; a call's prompt takes 1 block, its reservation 20 more (the prior's
    # p90, 320 tokens). The engine does not step, so every dispatched call waits in it.
    env = await make_env(MemoryQuotaStore(), num_blocks=32, steps=False)
    engine, dispatcher = env.engine, env.dispatcher
    for i in range(3):
        await admit(dispatcher, job(f"j{i}", ("a", 1000)))
    await anyio.wait_all_tasks_blocked()
    waiting = engine.core.scheduler.waiting
    assert [r.request_id for r in waiting] == ["j0/a"]  # by prompts alone all three fitted
    assert len(dispatcher.core.ready) == 2


async def test_past_the_knee_only_the_most_urgent_job_adds_calls(make_env: MakeEnv) -> None:
    # The engine does not step, so dispatched calls stay in it; room is plentiful, the knee is 2.
    env = await make_env(MemoryQuotaStore(), steps=False, knee_calls=2)
    for i in range(5):
        await admit(env.dispatcher, job(f"j{i}", ("a", 100)))
    await anyio.wait_all_tasks_blocked()
    assert len(env.engine.core.scheduler.waiting) == 2
    assert len(env.dispatcher.core.ready) == 3  # held by the policy, not refused
    # a much smaller job is now the most urgent (earliest fair-share finish): it passes the knee
    await admit(env.dispatcher, job("small", ("b", 1)))
    await anyio.wait_all_tasks_blocked()
    assert [r.request_id for r in env.engine.core.scheduler.waiting][-1] == "small/b"
    assert len(env.dispatcher.core.ready) == 3


async def test_engine_priorities_follow_the_policys_rekeys(make_env: MakeEnv) -> None:
    """Every re-key reaches the engine: on a clock each of whose readings is PROGRESS_REKEY_S
    after the last, progress past a prediction re-keys the job at every token."""
    ticks = itertools.count()
    env = await make_env(MemoryQuotaStore(), clock=lambda: next(ticks) * PROGRESS_REKEY_S)
    engine, dispatcher = env.engine, env.dispatcher
    run = job("j", ("short", 2), ("long", 600))
    await admit(dispatcher, run)
    requests = engine.core.scheduler.requests
    seen: list[float] = []

    def check() -> None:  # the engine holds the policy's current priority for "long"
        priority = dispatcher.core.policy.priority("j/long")
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


async def test_a_prefilled_call_is_predicted_again_from_its_hidden_state(
    make_env: MakeEnv,
) -> None:
    refiner = hidden_refiner()
    env = await make_env(MemoryQuotaStore(), refiner=refiner)
    run = job("j", ("a", 40))
    await admit(env.dispatcher, run)
    async for _ in run.watch():
        pass
    runner = env.engine.core.runner
    assert isinstance(runner, SimulatedRunner)
    hidden = runner.hidden_vector("j/a")
    expected = refiner.distribution(1.0 + 3.0 * hidden[0], 40)
    policy = env.dispatcher.core.policy
    assert isinstance(policy, RecordingJustitia)
    [(call_id, predicted, before, after)] = policy.refined
    assert call_id == "j/a" and predicted == pytest.approx(expected.mean)
    assert predicted != LENGTH_PRIOR.capped(40).mean and after != before  # the job was re-keyed
    assert env.engine.predictions == [("j/a", math.ceil(expected.p90))]


async def test_without_a_refiner_no_call_is_refined(make_env: MakeEnv) -> None:
    env = await make_env(MemoryQuotaStore())
    run = job("j", ("a", 40))
    await admit(env.dispatcher, run)
    async for _ in run.watch():
        pass
    policy = env.dispatcher.core.policy
    assert isinstance(policy, RecordingJustitia) and policy.refined == []
    assert env.engine.predictions == []


async def test_a_call_past_its_p90_is_counted_once_while_it_runs(make_env: MakeEnv) -> None:
    tracker = ErrorTracker(streak=3)  # two calls counted twice each would make four in a row
    env = await make_env(MemoryQuotaStore(), tracker=tracker)
    run = job("j", ("a", 400), ("b", 400))  # the prior's p90 is 320; each call runs to 400
    await admit(env.dispatcher, run)
    async for _ in run.watch():
        pass
    planner = env.dispatcher.planner
    assert isinstance(planner, RecordingPlanner)
    first_past = math.floor(LENGTH_PRIOR.p90) + 1
    [(key, at_a), (same_key, at_b)] = planner.overruns  # both are the tenant's unnamed calls
    assert key == same_key and at_a == at_b == first_past
    stats = tracker.stats(key)
    assert (stats.count, stats.p90_coverage, stats.overrunning) == (2, 0.0, 0)
    assert not stats.conservative


async def test_a_kind_turned_conservative_widens_its_tenants_ready_calls(make_env: MakeEnv) -> None:
    """Calls planned before their kind turned conservative kept their optimistic plan while
    they waited: a tenant found to lie kept the head start of its backlog. One call runs at a
    time (one slot: the blocks alone would let the next in once a call's prompt is placed, and
    whether a pass comes before that call's end is timing): three of the liar's calls run past
    the prior's p90 (320) to their max_tokens, and its calls of that kind still waiting are
    ordered and reserved at what its kind produces; its calls of another kind, and another
    tenant's, keep their plans."""
    store = MemoryQuotaStore()
    tracker, policy = ErrorTracker(), RecordingFcfs()
    env = await make_env(store, num_blocks=32, max_num_seqs=1, tracker=tracker, policy=policy)
    await store.create_tenant("honest", "Honest", QUOTA)
    other_kind = NodeSpec(
        id="t", prompt_template="say t", sampling=SamplingSpec(max_tokens=400), name="translate"
    )
    liar = job("liar", *((f"n{i}", 400) for i in range(6)))
    liar = JobRun("liar", "acme", JobSpec(nodes=(*liar.spec.nodes, other_kind)), time.time())
    honest = job("honest", ("a", 20), ("b", 20))
    honest = JobRun("honest", "honest", honest.spec, time.time())
    for run in (liar, honest):
        await admit(env.dispatcher, run)
    for run in (liar, honest):
        async for _ in run.watch():
            pass
    assert liar.state is JobState.SUCCEEDED and honest.state is JobState.SUCCEEDED
    assert policy.refined == [("liar/n3", 400.0), ("liar/n4", 400.0), ("liar/n5", 400.0)]
    prior = math.ceil(LENGTH_PRIOR.p90)
    assert env.engine.reserved == {
        **{f"liar/n{i}": prior for i in range(3)},  # the three that ran first, planned so
        **{f"liar/n{i}": 400 for i in range(3, 6)},
        "liar/t": prior,
        "honest/a": 20,
        "honest/b": 20,
    }


async def test_a_backlog_planned_again_leaves_the_loop_to_others_between_its_jobs(
    make_env: MakeEnv,
) -> None:
    """A tenant's backlog was planned again in one go on the loop as its kind turned
    conservative: about a second at 65,536 ready calls, every other tenant's streams,
    dispatches and RPCs held that long. Now a job at a time: a task woken by the first job's
    re-plan runs before the next job's. One call at a time, as above."""
    store = MemoryQuotaStore()
    tracker, policy = ErrorTracker(), RecordingFcfs()
    env = await make_env(store, num_blocks=32, max_num_seqs=1, tracker=tracker, policy=policy)
    core = env.dispatcher.core
    order: list[str] = []
    first_planned = anyio.Event()
    replan_job = core.replan_job

    def recorded(job_id: str, *args: Any) -> Any:
        order.append(job_id)
        first_planned.set()
        return replan_job(job_id, *args)

    core.replan_job = recorded  # type: ignore[method-assign,assignment]

    async def another_tenant_s_work() -> None:
        await first_planned.wait()
        order.append("another tenant's work")

    liar = job("liar", *((f"n{i}", 400) for i in range(4)))
    backlog = [job(f"more{i}", ("n0", 400)) for i in range(3)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(another_tenant_s_work)
        for run in (liar, *backlog):
            await admit(env.dispatcher, run)
        for run in (liar, *backlog):
            async for _ in run.watch():
                pass
    assert order[1] == "another tenant's work"  # after the first job's re-plan, not the last's
    assert sorted(order[:1] + order[2:]) == ["liar", "more0", "more1", "more2"]
    # each waiting call was planned again
    assert sorted(c for c, _ in policy.refined) == ["liar/n3", "more0/n0", "more1/n0", "more2/n0"]


async def test_a_call_run_again_after_its_kind_turned_conservative_is_planned_so(
    make_env: MakeEnv,
) -> None:
    """A call planned before its kind turned conservative and sent back to wait (here its job
    fenced: the same way as a yield or a lost backend) ran again on its optimistic plan. Four of
    the liar's calls run together past the prior's p90 (320) towards their max_tokens, turning
    their kind conservative; then the job is fenced and renewed at once: each runs again,
    reserving what its kind produces."""
    store = MemoryQuotaStore()
    env = await make_env(store, tracker=ErrorTracker())
    fenced: set[str] = set()
    env.dispatcher.fenced = lambda run: run.job_id in fenced
    liar = job("liar", *((f"n{i}", 400) for i in range(4)))
    await admit(env.dispatcher, liar)
    produced: Counter[str] = Counter()
    with anyio.fail_after(10):
        async for event in liar.watch():
            body = event.body
            if isinstance(body, TokensAdded):
                produced[body.node_id] += len(body.token_ids)
                if len(produced) == 4 and min(produced.values()) > 330 and not env.engine.aborted:
                    fenced.add("liar")
                    env.dispatcher.job_fenced(liar)
                    fenced.clear()
                    env.dispatcher.lease_renewed()
    assert liar.state is JobState.SUCCEEDED
    assert sorted(env.engine.aborted) == [f"liar/n{i}" for i in range(4)]
    assert env.engine.reserved == {f"liar/n{i}": 400 for i in range(4)}  # the second attempts'


# the liar's calls reserve the prior's p90; the next job's, planned before, reserve their kind's
LIAR_THEN_LATER_WIDENED = {
    **{f"liar/n{i}": math.ceil(LENGTH_PRIOR.p90) for i in range(3)},
    "later/a": 400,
    "later/b": 400,
}


async def a_liar_turns_its_kind_conservative(dispatcher: Dispatcher) -> None:
    """The liar's three calls run past the prior's p90 (320) to their max_tokens (400)."""
    liar = job("liar", *((f"n{i}", 400) for i in range(3)))
    await admit(dispatcher, liar)
    async for _ in liar.watch():
        pass


async def test_a_root_planned_before_its_kind_turned_conservative_is_planned_so_as_it_is_added(
    make_env: MakeEnv,
) -> None:
    """A job's roots are planned before its admission, and its admission awaits the store (and
    the journal): a kind that turns conservative meanwhile found them outside the ready calls,
    so they joined them on their optimistic plan. Here the liar's three calls run past the
    prior's p90 (320) to their max_tokens while the next job's admission is on its way."""
    store = MemoryQuotaStore()
    env = await make_env(store, tracker=ErrorTracker())
    later = job("later", ("a", 400), ("b", 400))
    admitted = await env.dispatcher.admit(later, QUOTA)  # its roots planned: store, journal
    await a_liar_turns_its_kind_conservative(env.dispatcher)
    env.dispatcher.submit(later, QUOTA, admitted)
    async for _ in later.watch():
        pass
    assert later.state is JobState.SUCCEEDED
    assert env.engine.reserved == LIAR_THEN_LATER_WIDENED


class RateLimitedOnce(MemoryQuotaStore):
    """Holds the first reserve of each of the `held` job's calls until `answer` is set, then
    refuses it on the tenant's token rate (a call taken, sent back to wait)."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held = held
        self.answer = anyio.Event()
        self.asked: set[str] = set()

    async def reserve(self, tenant_id: str, call_id: str, tokens: int, ttl_s: float) -> Reservation:
        if call_id.startswith(f"{self.held}/") and call_id not in self.asked:
            self.asked.add(call_id)
            await self.answer.wait()
            raise QuotaExceeded(
                tenant_id=tenant_id,
                limit=QuotaLimit.TOKEN_RATE,
                allowed=0,
                requested=tokens,
                description="token rate",
                retry_after_s=0.0,
            )
        return await super().reserve(tenant_id, call_id, tokens, ttl_s)


async def test_a_call_refused_by_its_quota_after_its_kind_turned_conservative_is_planned_so(
    make_env: MakeEnv,
) -> None:
    """A call being taken (its reserve on its way) is in no ready calls as its kind turns
    conservative; refused by its tenant's token rate it waits again, and ran on its optimistic
    plan. Here the liar's three calls run past the prior's p90 (320) to their max_tokens while
    the next job's reserves are on their way."""
    store = RateLimitedOnce("later")
    env = await make_env(store, tracker=ErrorTracker())
    later = job("later", ("a", 400), ("b", 400))
    await admit(env.dispatcher, later)
    await anyio.wait_all_tasks_blocked()
    assert store.asked == {"later/a", "later/b"}
    await a_liar_turns_its_kind_conservative(env.dispatcher)
    store.answer.set()
    async for _ in later.watch():
        pass
    assert later.state is JobState.SUCCEEDED
    assert env.engine.reserved == LIAR_THEN_LATER_WIDENED


async def test_a_call_sent_back_to_wait_is_planned_again_without_a_scan_of_its_tenants_backlog(
    make_env: MakeEnv,
) -> None:
    """A call sent back to wait is planned again alone (its kind may have turned meanwhile):
    that looked at each ready call of its tenant, ~14 ms at 65,000 of them, for each call a
    quota refused, yielded, lost or fenced. Room for one call: the tenant's first call is
    taken and refused by its token rate while its 100 other jobs wait."""
    store = RateLimitedOnce("late")
    env = await make_env(store, num_blocks=32, steps=False, tracker=ErrorTracker())
    await admit(env.dispatcher, job("late", ("a", 400), ("b", 400)))
    for i in range(100):
        await admit(env.dispatcher, job(f"j{i}", ("a", 400)))
    await anyio.wait_all_tasks_blocked()
    assert store.asked == {"late/a"} and len(env.dispatcher.core.ready) == 101
    ready = env.dispatcher.core.ready
    looked_at: list[str] = []
    of_job = ready.of_job

    def counted(job_id: str) -> list[Any]:
        looked_at.append(job_id)
        return of_job(job_id)

    ready.of_job = counted  # type: ignore[method-assign]
    store.answer.set()
    await anyio.wait_all_tasks_blocked()
    assert "late/a" in ready and looked_at == []


async def test_store_round_trips_of_a_one_call_job_and_a_two_call_job(make_env: MakeEnv) -> None:
    store = CountingStore()
    env = await make_env(store)
    single, pair = job("single", ("a", 3)), job("pair", ("a", 3), ("b", 5))
    await admit(env.dispatcher, single)  # nothing else is ready: reserved with its admission
    async for _ in single.watch():
        pass
    await admit(env.dispatcher, pair)
    async for _ in pair.watch():
        pass
    await anyio.wait_all_tasks_blocked()
    assert store.ops[:2] == ["admit_job_and_reserve", "settle finishing single"]
    assert sorted(store.ops[2:]) == [
        "admit_job",
        "reserve",
        "reserve",
        "settle",
        "settle finishing pair",
    ]
    usage = await store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations, usage.settled_calls) == (0, 0, 3)
    assert not env.engine.core.scheduler.requests


async def test_tenants_whose_jobs_ended_or_were_refused_keep_no_tokenizing_worker(
    make_env: MakeEnv,
) -> None:
    """Each tenant that ever submitted, or even tried to, kept its tokenizing worker for good:
    tenants come and go, the dispatcher only grew."""
    store = MemoryQuotaStore()
    env = await make_env(store)
    spec = job("any", ("a", 3)).spec
    for i in range(3):
        await store.create_tenant(f"t{i}", "T", QUOTA)
        run = JobRun(f"j{i}", f"t{i}", spec, time.time())
        await admit(env.dispatcher, run)
        async for _ in run.watch():
            pass
    narrow = TenantQuota(max_tokens_ceiling=2048, max_nodes_per_job=1)
    await store.create_tenant("refused", "R", narrow)
    with pytest.raises(QuotaExceeded):
        wide = job("wide", ("a", 3), ("b", 3)).spec
        await env.dispatcher.admit(JobRun("wide", "refused", wide, time.time()), narrow)
    await anyio.wait_all_tasks_blocked()
    assert not env.dispatcher.intake._tokenizing


async def test_a_call_held_from_admission_is_released_if_never_dispatched(
    make_env: MakeEnv,
) -> None:
    store = CountingStore()
    env = await make_env(store, num_blocks=32, steps=False)
    first, second = job("first", ("a", 1000)), job("second", ("a", 1000))
    await admit(env.dispatcher, first)  # held, dispatched, then waits in the engine
    await anyio.wait_all_tasks_blocked()
    await admit(env.dispatcher, second)  # no room left for it: admitted alone
    await anyio.wait_all_tasks_blocked()
    assert store.ops == ["admit_job_and_reserve", "admit_job"]
    held = job("held", ("a", 4))
    env.dispatcher.cancel(first, "to make room")
    await anyio.wait_all_tasks_blocked()
    await admit(env.dispatcher, held, then=lambda: env.dispatcher.cancel(held, "at once"))
    await anyio.wait_all_tasks_blocked()
    # the first's call released and job finished; the second dispatched; the third held, freed
    assert sorted(store.ops[2:5]) == ["finish_job", "release", "reserve"]
    assert store.ops[5:] == ["admit_job_and_reserve", "release", "finish_job"]
    usage = await store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations) == (1, 1)  # the second job's call


async def test_a_call_is_held_only_when_the_engine_has_room_for_every_ready_call_too(
    make_env: MakeEnv,
) -> None:
    store = CountingStore()
    env = await make_env(store, num_blocks=32, steps=False)  # a large call takes 21 blocks
    await admit(env.dispatcher, job("large-1", ("a", 1000)))  # held, then waits in the engine
    await anyio.wait_all_tasks_blocked()
    await admit(env.dispatcher, job("large-2", ("a", 1000)))  # no room: it stays ready
    await anyio.wait_all_tasks_blocked()
    assert list(env.dispatcher.core.ready) == ["large-2/a"]
    store.ops.clear()
    await admit(env.dispatcher, job("small", ("a", 4)))  # 2 blocks fit, but not beside large-2
    assert store.ops == ["admit_job"]


@pytest.mark.parametrize("arrive", ["submit", "resume"])
@pytest.mark.parametrize("step", ["arrivals", "plans"])
async def test_a_wide_jobs_arrival_lets_other_tasks_run_between_its_nodes_predictions_and_plans(
    make_env: MakeEnv, arrive: str, step: str
) -> None:
    """Each node's arrival cost is a prediction (the prompt model's pass, ~0.25 ms), and so is
    each root's plan as the job starts (with the anomaly guard's reading): all of a tenant's
    largest job predicted, or all of its roots planned, in one go held the event loop, so every
    other tenant's streams, dispatches and RPCs, for tens of ms."""
    env = await make_env(MemoryQuotaStore())
    planner = env.dispatcher.planner
    assert isinstance(planner, RecordingPlanner)
    tally: Tally = getattr(planner, step)
    nodes = 64  # all roots
    wide = job("wide", *((f"n{i}", 10) for i in range(nodes)))
    seen: list[int] = []

    async def another_tenants_task() -> None:
        await tally.first.wait()
        seen.append(tally.count)  # how many nodes were predicted, or planned, before it ran

    async with anyio.create_task_group() as tg:
        tg.start_soon(another_tenants_task)
        if arrive == "submit":
            await admit(env.dispatcher, wide)
        else:
            await env.dispatcher.resume(wide, QUOTA)
    assert tally.count == nodes
    assert 0 < seen[0] < nodes  # it ran while the job was being costed, or its roots planned


@pytest.mark.parametrize("others", [0, 1])
async def test_a_root_over_the_prompt_limit_fails_its_node_once_its_job_is_submitted(
    make_env: MakeEnv, others: int
) -> None:
    """Roots are planned as their job is admitted; one the planner refuses fails its own node
    only, and not before the job is submitted (an admission undone leaves no node failed)."""
    env = await make_env(MemoryQuotaStore())
    quota = TenantQuota(max_tokens_ceiling=2048, max_prompt_tokens=64)
    sampling = SamplingSpec(max_tokens=3)
    long = make_node("long", "say " * 64, sampling=sampling)
    spec = JobSpec(
        nodes=(long, *(make_node(f"n{i}", "say", sampling=sampling) for i in range(others)))
    )
    run = JobRun("refused", "acme", spec, time.time())
    admitted = await env.dispatcher.admit(run, quota)
    assert admitted.ticket is None  # a one-call job's call that is refused is not held
    assert all(node.state is NodeState.PENDING for node in run.nodes.values())
    env.dispatcher.submit(run, quota, admitted)
    async for _ in run.watch():
        pass
    assert run.nodes["long"].state is NodeState.FAILED
    assert "exceeds the limit of 64" in run.nodes["long"].reason
    assert all(run.nodes[f"n{i}"].state is NodeState.SUCCEEDED for i in range(others))


async def admit(
    dispatcher: Dispatcher, run: JobRun, then: Callable[[], None] = lambda: None
) -> None:
    """What the Gateway service does with a new job; `then` runs before the loop can."""
    dispatcher.submit(run, QUOTA, await dispatcher.admit(run, QUOTA))
    then()


async def test_a_fenced_job_starts_no_call_until_a_renewal_unfences_it(make_env: MakeEnv) -> None:
    """Its replica's lease on the job may have lapsed: the call reserved with its admission is
    set aside unsent and released, and waits; once a renewal finds the job this replica's, it
    runs under a fresh reservation, settled once."""
    store = CountingStore()
    env = await make_env(store)
    fenced = {"single"}
    env.dispatcher.fenced = lambda run: run.job_id in fenced
    single = job("single", ("a", 3))
    await admit(env.dispatcher, single)  # dispatched at once, as nothing else is ready
    await anyio.wait_all_tasks_blocked()
    assert store.ops == ["admit_job_and_reserve", "release"]
    assert single.nodes["a"].state is NodeState.READY and not env.engine.core.scheduler.requests
    env.dispatcher.lease_renewed()  # a renewal that left it fenced (taken over, say)
    await anyio.wait_all_tasks_blocked()
    assert store.ops == ["admit_job_and_reserve", "release"]
    fenced.clear()
    env.dispatcher.lease_renewed()
    async for _ in single.watch():
        pass
    await anyio.wait_all_tasks_blocked()
    assert store.ops[2:] == ["reserve", "settle finishing single"]
    assert single.state is JobState.SUCCEEDED
    usage = await store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations, usage.settled_calls) == (0, 0, 1)


@pytest.mark.parametrize("then", ["renewed", "renewed at once", "cancelled"])
async def test_a_running_call_of_a_job_fenced_is_aborted_and_released_never_failed(
    make_env: MakeEnv, then: str
) -> None:
    """The job's fencing deadline passes while its call runs: the call is aborted on its
    backend, released, and its node is READY again (not failed), the job held until a renewal
    lands; then it runs again here, settled once. A renewal landing before the aborted call's
    end is seen runs it again at once; a cancel meanwhile ends it, released once."""
    store = CountingStore()
    env = await make_env(store)
    fenced: set[str] = set()
    env.dispatcher.fenced = lambda run: run.job_id in fenced
    single = job("single", ("a", 500))
    await admit(env.dispatcher, single)
    again: list[str] = []
    with anyio.fail_after(10):
        async for event in single.watch():
            body = event.body
            if isinstance(body, TokensAdded) and not fenced and not again:  # it runs
                fenced.add("single")
                env.dispatcher.job_fenced(single)
                if then == "renewed at once":
                    fenced.clear()
                    env.dispatcher.lease_renewed()
                elif then == "cancelled":
                    env.dispatcher.cancel(single)
            elif isinstance(body, NodeChanged) and body.previous is NodeState.RUNNING:
                if body.state is not NodeState.READY:
                    continue
                again.append(body.reason)
                if then == "renewed":
                    await anyio.wait_all_tasks_blocked()  # held: nothing starts
                    assert store.ops == ["admit_job_and_reserve", "release"]
                    assert not env.engine.core.scheduler.requests
                    fenced.clear()
                    env.dispatcher.lease_renewed()
    await anyio.wait_all_tasks_blocked()
    usage = await store.usage("acme")
    assert env.engine.aborted[0] == "single/a"
    assert (usage.queued_jobs, usage.active_reservations) == (0, 0)
    if then == "cancelled":
        assert single.state is JobState.CANCELLED and not again
        assert sorted(store.ops) == ["admit_job_and_reserve", "finish_job", "release"]
        return
    assert again == ["its job's lease may have lapsed: running again"]
    assert store.ops == ["admit_job_and_reserve", "release", "reserve", "settle finishing single"]
    assert single.state is JobState.SUCCEEDED and usage.settled_calls == 1


async def test_a_job_taken_over_keeps_its_place_first_come_first_served(
    make_env: MakeEnv,
) -> None:
    # One large call fills the engine, which does not step; a job submitted now waits, then a
    # job submitted a minute ago is taken over from another replica: when room comes, the job
    # that came first runs first, not the one this replica heard of first
    env = await make_env(MemoryQuotaStore(), num_blocks=32, steps=False, policy=FcfsPolicy())
    blocker = job("blocker", ("a", 1000))
    await admit(env.dispatcher, blocker)
    await admit(env.dispatcher, job("late", ("a", 1000)))
    early = job("early", ("a", 1000), created_at=time.time() - 60)
    early.start(early.created_at)  # by the replica that ran it before
    await env.dispatcher.resume(early, QUOTA)
    await anyio.wait_all_tasks_blocked()
    assert sorted(env.dispatcher.core.ready) == ["early/a", "late/a"]
    env.dispatcher.cancel(blocker, "to make room")
    await anyio.wait_all_tasks_blocked()
    assert [r.request_id for r in env.engine.core.scheduler.waiting] == ["early/a"]
    assert list(env.dispatcher.core.ready) == ["late/a"]


class ReleaseWatchingStore(CountingStore):
    def __init__(self) -> None:
        super().__init__()
        self.released = anyio.Event()

    async def release(self, tenant_id: str, call_id: str) -> bool:
        try:
            return await super().release(tenant_id, call_id)
        finally:
            self.released.set()


class CancelsAfterThePass(Dispatcher):
    """Cancels `victim` right after the dispatch pass that took its call, before the task that
    asks for the call's grant has run: a client's cancel that lands between the two."""

    victim: JobRun | None = None

    def _dispatch_ready(self) -> None:
        super()._dispatch_ready()
        victim = self.victim
        if victim is not None and f"{victim.job_id}/a" in self.core.taking:
            self.victim = None
            self.cancel(victim, "cancelled as its call was taken")


@pytest.mark.redis
async def test_a_call_whose_job_ends_before_its_take_runs_asks_nothing_and_keeps_nothing(
    make_env: MakeEnv, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = ReleaseWatchingStore()
    share = RedisShare(REDIS_URL, "r1", "fcfs", prefix=redis_prefix)
    try:
        env = await make_env(
            store, policy=FcfsPolicy(), share=share, dispatcher_type=CancelsAfterThePass
        )
        dispatcher = env.dispatcher
        assert isinstance(dispatcher, CancelsAfterThePass)
        doomed = dispatcher.victim = job("doomed", ("a", 100))
        await admit(dispatcher, doomed)  # reserved with its admission: it starts at once
        with anyio.fail_after(5):
            await store.released.wait()
        assert doomed.state is JobState.CANCELLED
        # released once, as the job ended: the take had reserved nothing of its own
        assert sorted(store.ops) == ["admit_job_and_reserve", "finish_job", "release"]
        usage = await store.usage("acme")
        assert (usage.queued_jobs, usage.active_reservations, usage.settled_calls) == (0, 0, 0)
        assert await share.counters("sim") == {}  # no grant was asked, so none was charged
        assert not env.engine.core.scheduler.requests
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # nothing failed
    finally:
        await share.aclose()


@pytest.mark.redis
async def test_a_replica_shut_down_pays_back_the_grants_of_the_calls_it_aborted(
    make_env: MakeEnv, redis_prefix: str
) -> None:
    """A rolling restart: the calls aborted, the dispatcher closes at once (before its heads'
    next publish): one last exchange trues each grant up and takes the replica's heads out."""
    share = RedisShare(REDIS_URL, "r1", "vtc", prefix=redis_prefix)
    try:
        env = await make_env(MemoryQuotaStore(), steps=False, policy=VtcPolicy(), share=share)
        dispatcher = env.dispatcher
        runs = [job(f"j{i}", ("a", 1000)) for i in range(4)]
        for run in runs:
            await admit(dispatcher, run)
        with anyio.fail_after(5):
            while len(dispatcher.core.running) < 4:
                await anyio.wait_all_tasks_blocked()
        assert (await share.counters("sim"))["acme"] > 0  # each charged its worst case
        dispatcher.pause()  # what server.py's shutdown does: pause, abort, close
        for run in runs:
            dispatcher.cancel(run, "server shutting down")
        await dispatcher.aclose()
        assert await share.counters("sim") == {"acme": 0.0}  # none of them ran
        _, active, waiting = share.keys("sim")
        redis = SyncRedis.from_url(REDIS_URL)
        try:
            assert redis.zcard(active) == redis.zcard(waiting) == 0
        finally:
            redis.close()
    finally:
        await share.aclose()


class HoldingStore(ReleaseWatchingStore):
    """Holds call b's reserve and call a's settle until the test lets each go."""

    def __init__(self) -> None:
        super().__init__()
        self.reserving_b, self.reserve_b = anyio.Event(), anyio.Event()
        self.settling_a, self.settle_a = anyio.Event(), anyio.Event()

    async def reserve(self, tenant_id: str, call_id: str, tokens: int, ttl_s: float) -> Reservation:
        if call_id.startswith("j/b"):
            self.reserving_b.set()
            await self.reserve_b.wait()
        return await super().reserve(tenant_id, call_id, tokens, ttl_s)

    async def settle(
        self,
        tenant_id: str,
        call_id: str,
        input_tokens: int,
        output_tokens: int,
        *,
        finish_job: str | None = None,
    ) -> bool:
        if call_id.startswith("j/a"):
            self.settling_a.set()
            await self.settle_a.wait()
        return await super().settle(
            tenant_id, call_id, input_tokens, output_tokens, finish_job=finish_job
        )


async def test_a_job_cancelled_while_a_call_settles_never_starts_the_call_being_taken(
    make_env: MakeEnv,
) -> None:
    store = HoldingStore()
    env = await make_env(store)
    run = job("j", ("a", 4), ("b", 4))
    await admit(env.dispatcher, run)  # both calls taken: a reserved and run, b's reserve held
    with anyio.fail_after(5):
        await store.reserving_b.wait()
        await store.settling_a.wait()  # a has ended: the job stays open until it is settled
    env.dispatcher.cancel(run, charge=True)
    assert run.nodes["b"].state is NodeState.CANCELLED and not run.ended
    store.reserve_b.set()  # b's reserve lands after the cancel: it is released, not sent
    with anyio.fail_after(5):
        await store.released.wait()
    assert run.nodes["b"].state is NodeState.CANCELLED
    assert not env.engine.core.scheduler.requests
    store.settle_a.set()
    await anyio.wait_all_tasks_blocked()
    assert run.state is JobState.CANCELLED and run.nodes["b"].state is NodeState.CANCELLED
    # b's reserve released once it landed; only a settled
    assert store.ops == ["admit_job", "reserve", "reserve", "release", "settle", "finish_job"]
    usage = await store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations, usage.settled_calls) == (0, 0, 1)


async def test_wait_calls_closed_returns_once_every_call_of_a_cancelled_job_is_closed(
    make_env: MakeEnv,
) -> None:
    """A cancel returns while its calls are still being taken and settled: the reserve that
    lands after it is released, the settle under way lands, then the job's finish."""
    store = HoldingStore()
    env = await make_env(store)
    run = job("j", ("a", 4), ("b", 4))
    await admit(env.dispatcher, run)
    with anyio.fail_after(5):
        await store.reserving_b.wait()
        await store.settling_a.wait()
    env.dispatcher.cancel(run, charge=True)
    closed = anyio.Event()

    async def wait() -> None:
        await env.dispatcher.wait_calls_closed()
        closed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert not closed.is_set()  # b's reserve and a's settle are held
        store.reserve_b.set()
        await anyio.wait_all_tasks_blocked()
        assert not closed.is_set()  # a's settle is
        store.settle_a.set()
        with anyio.fail_after(5):
            await closed.wait()
    assert run.state is JobState.CANCELLED
    usage = await store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations, usage.settled_calls) == (0, 0, 1)


class MonitoredDispatcher(Dispatcher):
    """A dispatcher with an SLO monitor (every call's TTFT target 1 s) on a clock of the test's."""

    clock_now = FakeClock()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        slo = SloConfig((SloTarget("*", ttft_s=1.0),))
        super().__init__(*args, **kwargs, slo=slo, clock=self.clock_now)


async def test_calls_judged_overdue_leave_the_slo_monitor_with_their_cancelled_jobs(
    make_env: MakeEnv,
) -> None:
    # the engine does not step: every call waits without a token, past its target
    env = await make_env(
        MemoryQuotaStore(), num_blocks=32, steps=False, dispatcher_type=MonitoredDispatcher
    )
    dispatcher = env.dispatcher
    runs = [job(f"j{i}", ("a", 1000), created_at=MonitoredDispatcher.clock_now()) for i in range(4)]
    for run in runs:
        await admit(dispatcher, run)
    await anyio.wait_all_tasks_blocked()
    MonitoredDispatcher.clock_now.advance(2.0)
    overload = dispatcher.overload
    assert overload is not None
    overload.tick()
    assert overload.monitor.overdue_calls == 4
    for run in runs[1:]:
        dispatcher.cancel(run)
    await anyio.wait_all_tasks_blocked()
    overload.tick()
    assert overload.monitor.overdue_calls == 1  # only the call still waiting is remembered


class HeldAdmission(CountingStore):
    """Holds a job's admission until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.admitting, self.admit = anyio.Event(), anyio.Event()

    async def admit_job(
        self, tenant_id: str, job_id: str, num_nodes: int, *, ttl_s: float = 3600.0
    ) -> bool:
        self.admitting.set()
        await self.admit.wait()
        return await super().admit_job(tenant_id, job_id, num_nodes, ttl_s=ttl_s)


class RefusingFcfs(FcfsPolicy):
    """Refuses every job it is given: a policy that fails once a job is admitted."""

    def add_job(self, info: JobInfo, now: float) -> None:
        raise RuntimeError("the policy failed")


async def test_a_take_over_that_fails_after_its_admission_leaves_nothing_admitted(
    make_env: MakeEnv,
) -> None:
    store = CountingStore()
    env = await make_env(store, policy=RefusingFcfs())
    run = job("taken", ("a", 100))
    run.start(run.created_at)  # by the replica that ran it before
    with pytest.raises(RuntimeError, match="the policy failed"):
        await env.dispatcher.resume(run, QUOTA)
    await anyio.wait_all_tasks_blocked()
    assert store.ops == ["admit_job", "finish_job"]
    assert (await store.usage("acme")).queued_jobs == 0


async def test_a_job_cancelled_while_it_is_taken_over_leaves_nothing_admitted(
    make_env: MakeEnv,
) -> None:
    # the cancel a client asked of the dead replica reaches this one while it admits the job
    store = HeldAdmission()
    env = await make_env(store)
    run = job("taken", ("a", 100))
    run.start(run.created_at)  # by the replica that ran it before
    async with anyio.create_task_group() as tg:
        tg.start_soon(env.dispatcher.resume, run, QUOTA)
        with anyio.fail_after(5):
            await store.admitting.wait()
        env.dispatcher.cancel(run, "cancelled by the client", charge=True)
        store.admit.set()
    await anyio.wait_all_tasks_blocked()
    assert run.state is JobState.CANCELLED and run.job_id not in env.dispatcher.runs
    assert store.ops == ["admit_job", "finish_job"]
    usage = await store.usage("acme")
    assert (usage.queued_jobs, usage.active_reservations) == (0, 0)
    assert env.dispatcher.active_jobs("acme") == 0


class SlowSettle(MemoryQuotaStore):
    """A store whose settle takes `delay_s` on the dispatcher's clock (a round trip under
    load, or a failover)."""

    def __init__(self, clock: FakeClock, delay_s: float) -> None:
        super().__init__()
        self.clock, self.delay_s = clock, delay_s

    async def settle(self, *args: Any, **kwargs: Any) -> bool:
        self.clock.advance(self.delay_s)
        return await super().settle(*args, **kwargs)


async def test_per_token_and_run_times_end_at_the_last_token_not_after_the_settle(
    make_env: MakeEnv,
) -> None:
    """A finished call's node ends once the quota store has settled it; its per-token time (in
    the metrics and the SLO monitor's verdict) and its run time ran to that end, so a slow store
    made every call look slow to stream: a settle of 60 s, 3 s a token over 20 tokens."""
    clock = FakeClock()
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    metrics = GatewayMetrics(genai=GenAiMetrics(meters.get_meter("test")))
    slo = SloConfig((SloTarget("*", ttft_s=1.0, tpot_s=0.1),), min_calls=1)

    class Timed(Dispatcher):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs, slo=slo, clock=clock, metrics=metrics)

    env = await make_env(SlowSettle(clock, 60.0), dispatcher_type=Timed)
    run = job("j", ("a", 21), created_at=clock())
    await admit(env.dispatcher, run)
    with anyio.fail_after(10):
        async for _ in run.watch():
            pass
    node = run.nodes["a"]
    assert run.state is JobState.SUCCEEDED and node.output_tokens >= 2
    assert node.finished_at == clock() and node.first_token_at == clock() - 60.0
    # the engine streamed every token at one instant of the test's clock
    tpot = metrics.registry.get_sample_value(
        "fairgate_time_per_output_token_seconds_sum", {"tenant": "acme"}
    )
    assert tpot == 0.0
    data = reader.get_metrics_data()
    assert data is not None
    durations = [
        point.sum
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "gen_ai.server.request.duration"
        for point in metric.data.data_points  # type: ignore[attr-defined]
    ]
    assert durations == [0.0]
    overload = env.dispatcher.overload
    assert overload is not None and overload.monitor.violation_rate(clock()) == 0.0
    meters.shutdown()


class _Ticking:
    """A backend's stream each of whose tokens takes `tick_s` of the dispatcher's clock."""

    def __init__(self, stream: CallStream, clock: FakeClock, tick_s: float) -> None:
        self._stream, self._clock, self._tick_s = stream, clock, tick_s

    @property
    def usage(self) -> CallUsage | None:
        return self._stream.usage

    def __aiter__(self) -> _Ticking:
        return self

    async def __anext__(self) -> TokenDelta:
        delta = await self._stream.__anext__()
        self._clock.advance(self._tick_s * len(delta.token_ids))
        return delta

    async def aclose(self) -> None:
        await self._stream.aclose()


class _Paced(LocalBackend):
    """A local backend that streams a token every `tick_s` of the test's clock, and that the
    test can close to new calls (no free slot)."""

    def __init__(self, engine: AsyncEngine, name: str, clock: FakeClock, tick_s: float) -> None:
        super().__init__(engine, "sim", name)
        self.clock, self.tick_s, self.closed = clock, tick_s, False

    def capacity(self) -> BackendCapacity:
        room = super().capacity()
        return dataclasses.replace(room, free_slots=0) if self.closed else room

    def submit(self, call: BackendCall) -> CallStream:
        return _Ticking(super().submit(call), self.clock, self.tick_s)


async def test_the_router_learns_each_backends_speed_from_the_calls_that_finish() -> None:
    """A finished call's per-token time was read before its node ended (None until then), so
    the router never learned a backend's speed: a pool of a slow and a fast backend, both idle,
    sent the next call to the slow one (the tie going to the name)."""
    clock = FakeClock()
    store = MemoryQuotaStore()
    await store.create_tenant("acme", "Acme", QUOTA)
    async with contextlib.AsyncExitStack() as stack:
        engines, backends = {}, {}
        for name, tick_s in (("a", 1.0), ("b", 0.01)):
            engine = await stack.enter_async_context(RecordingEngine(sim_core()))
            engines[name], backends[name] = engine, _Paced(engine, name, clock, tick_s)
        planner = RecordingPlanner(HistoryPredictor(LENGTH_PRIOR), AnomalyGuard(), CallDefaults())
        tokenizer = engines["a"].core.tokenizer
        lane = make_lane("sim", list(backends.values()), tokenizer, RecordingJustitia(), planner)
        dispatcher = Dispatcher([lane], store, planner, DispatchConfig(), clock=clock)
        await stack.enter_async_context(dispatcher)
        for i, only in enumerate(("a", "b", None)):  # one call on each alone, then a choice
            for name, backend in backends.items():
                backend.closed = only is not None and name != only
            run = job(f"j{i}", ("x", 16), created_at=clock())
            await admit(dispatcher, run)
            with anyio.fail_after(10):
                async for _ in run.watch():
                    pass
            assert run.state is JobState.SUCCEEDED
    assert "j2/x" in engines["b"].reserved and "j2/x" not in engines["a"].reserved
