"""The two quota stores are twins: one generated sequence of operations, run on the in-memory
store and on a real Redis, gets the same answers from both.

A Hypothesis state machine (derandomized: every run sends the same sequences) draws operations
on two tenants with small quotas, so every limit is hit: create, update and delete a tenant,
admit and finish jobs, reserve (now and then the most a request may count), settle, release and
renew calls, read usage. Each operation runs
on both stores and must return the same value or raise the same error (a QuotaExceeded with the
same limit, allowed and requested); after each step both tenants' usage must agree.

Time: the memory store's clock starts at Redis TIME and moves `TICK_S` before each of its
operations, as Redis time moves by at least a round trip. Leases are either long (they outlive
the example) or `TINY_TTL_S`, which has run out by the next operation on either store, so expiry,
reclaim and late settles happen at the same step on both. What real time still changes is the
bucket's refill: under `MAX_RATE` per minute and within `MAX_EXAMPLE_S`, less than one token. The
quota arithmetic is in whole tokens, so both stores then take the same decisions and their bucket
levels have the same whole part; an example that runs longer, or across a UTC midnight, is
rejected rather than compared.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, note, reject, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from redis import Redis as SyncRedis

from tenants import (
    MemoryQuotaStore,
    QuotaExceeded,
    QuotaLimit,
    QuotaStore,
    RedisQuotaStore,
    Reservation,
    Tenant,
    TenantQuota,
    Usage,
)
from tenants.models import DAY_S, MAX_NARROW_COUNT
from tests.conftest import REDIS_URL
from tests.event_loop import TestEventLoop
from tests.fake_clock import FakeClock

TENANTS = ("acme", "beta")
CALLS = tuple(f"c{i}" for i in range(8))  # a closed id stays closed: room for new ones
JOBS = ("j0", "j1", "j2")
TICK_S = 1e-5  # the memory clock's move before each operation: Redis time moves a round trip
TINY_TTL_S = 1e-6  # run out by the next operation, on both stores
LONG_TTLS_S = (600.0, 900.0)  # outlive any example; two, so a renew that did not land shows
MAX_RATE = 30  # tokens per minute: half a token of refill a second
MAX_EXAMPLE_S = 1.5  # under a token of refill at MAX_RATE
CLOCK_SLACK_S = 5.0  # how far the two stores' clocks may be apart (expiries, created_at)


class Op(NamedTuple):
    """One store call: `method(*args, **kwargs)`, printed so."""

    method: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.method}({', '.join(shown)})"

    async def run(self, store: QuotaStore) -> object:
        return await getattr(store, self.method)(*self.args, **dict(self.kwargs))


tenants = st.sampled_from(("acme",) * 3 + ("beta",))
call_ids = st.sampled_from(CALLS)
job_ids = st.sampled_from(JOBS)
ttls = st.sampled_from((TINY_TTL_S, *LONG_TTLS_S))
actual_tokens = st.integers(0, 25)
# now and then the most a request may count
tokens = actual_tokens | st.just(MAX_NARROW_COUNT)
quotas = st.builds(
    TenantQuota,
    tokens_per_minute=st.sampled_from((0, 12, MAX_RATE)),
    max_concurrent_calls=st.integers(0, 3),
    max_queued_jobs=st.integers(0, 3),
    max_nodes_per_job=st.integers(0, 3),
    daily_token_budget=st.sampled_from((0, 20, 50, 2**53)),
)


def ops() -> st.SearchStrategy[Op]:
    def op(
        method: str, *args: st.SearchStrategy[Any], **kwargs: st.SearchStrategy[Any]
    ) -> st.SearchStrategy[Op]:
        drawn = st.tuples(st.tuples(*args), st.fixed_dictionaries(kwargs))
        return drawn.map(lambda a_k: Op(method, a_k[0], tuple(sorted(a_k[1].items()))))

    lifecycle = st.one_of(
        op("create_tenant", tenants, st.just(""), quotas),
        op("update_tenant", tenants, quota=quotas),
        op("update_tenant", tenants, display_name=st.sampled_from(("", "Renamed"))),
        op("delete_tenant", tenants),
        op("get_tenant", tenants),
        op("list_tenants", st.sampled_from(("", "acme", "b", "beta")), st.integers(0, 2)),
    )
    jobs = st.one_of(
        op("admit_job", tenants, job_ids, st.integers(0, 4), ttl_s=ttls),
        op("admit_job_and_reserve", tenants, job_ids, st.integers(0, 4), call_ids, tokens, ttls),
        op("finish_job", tenants, job_ids),
    )
    calls = st.one_of(
        op("reserve", tenants, call_ids, tokens, ttls),
        op(
            "settle",
            tenants,
            call_ids,
            actual_tokens,
            actual_tokens,
            finish_job=st.none() | job_ids,
        ),
        op("release", tenants, call_ids),
        op(
            "renew",
            tenants,
            calls=st.lists(call_ids, max_size=3),
            jobs=st.lists(job_ids, max_size=2),
            ttl_s=ttls,
        ),
        op("usage", tenants),
    )
    # calls are the heart of it; a tenant deleted or replaced now and then starts afresh
    return st.sampled_from((calls,) * 6 + (jobs,) * 3 + (lifecycle,)).flatmap(lambda ops: ops)


@dataclass
class Outcome:
    value: object = None
    error: BaseException | None = None


def redis_time(client: SyncRedis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def near(a: float, b: float, slack: float) -> bool:
    return abs(a - b) <= slack


def differences(memory: object, redis: object) -> Iterator[str]:
    """What differs between two answers, allowing for the clocks: expiries and creation times
    within CLOCK_SLACK_S, bucket levels with the same whole part."""
    match memory, redis:
        case Reservation(), Reservation():
            if (memory.call_id, memory.tokens) != (redis.call_id, redis.tokens):
                yield f"reservation {memory} != {redis}"
            if not near(memory.expires_at, redis.expires_at, CLOCK_SLACK_S):
                yield f"expires_at {memory.expires_at} != {redis.expires_at}"
        case Tenant(), Tenant():
            if (memory.tenant_id, memory.display_name, memory.quota) != (
                redis.tenant_id,
                redis.display_name,
                redis.quota,
            ):
                yield f"tenant {memory} != {redis}"
            if not near(memory.created_at, redis.created_at, CLOCK_SLACK_S):
                yield f"created_at {memory.created_at} != {redis.created_at}"
        case Usage(), Usage():
            for f in fields(Usage):
                ours, theirs = getattr(memory, f.name), getattr(redis, f.name)
                if f.name == "as_of":
                    same = near(ours, theirs, CLOCK_SLACK_S)
                elif f.name == "bucket_level" and ours is not None and theirs is not None:
                    same = math.floor(ours) == math.floor(theirs)
                else:
                    same = ours == theirs
                if not same:
                    yield f"usage.{f.name} {ours!r} != {theirs!r}"
        case list(), list() if len(memory) == len(redis):
            for ours, theirs in zip(memory, redis, strict=True):
                yield from differences(ours, theirs)
        case _:
            if memory != redis:
                yield f"{memory!r} != {redis!r}"


def error_differences(memory: BaseException, redis: BaseException) -> Iterator[str]:
    if type(memory) is not type(redis):
        yield f"raised {memory!r} != {redis!r}"
        return
    if not isinstance(memory, QuotaExceeded) or not isinstance(redis, QuotaExceeded):
        return
    for name in ("tenant_id", "limit", "allowed", "requested"):
        if getattr(memory, name) != getattr(redis, name):
            yield f"QuotaExceeded.{name} {getattr(memory, name)!r} != {getattr(redis, name)!r}"
    if memory.limit is not QuotaLimit.TOKEN_RATE and memory.description != redis.description:
        yield f"description {memory.description!r} != {redis.description!r}"
    hints = memory.retry_after_s, redis.retry_after_s
    if (hints[0] is None) != (hints[1] is None) or (
        hints[0] is not None
        and hints[1] is not None
        # a token of refill apart at most, or the clocks' distance to midnight
        and not near(hints[0], hints[1], CLOCK_SLACK_S + 60.0 / max(memory.allowed, 1))
    ):
        yield f"retry_after_s {hints[0]!r} != {hints[1]!r}"


@dataclass
class Twins:
    """Both stores and what drives them: the memory store's clock, one event loop."""

    runner: asyncio.Runner
    memory: MemoryQuotaStore
    redis: RedisQuotaStore
    clock: FakeClock
    started: float = field(default_factory=time.time)

    async def _run(self, store: QuotaStore, op: Op) -> Outcome:
        try:
            return Outcome(value=await op.run(store))
        except Exception as error:  # every error is part of the answer compared
            return Outcome(error=error)

    def both(self, op: Op) -> tuple[Outcome, Outcome]:
        self.clock.advance(TICK_S)
        return self.runner.run(self._run(self.memory, op)), self.runner.run(
            self._run(self.redis, op)
        )

    def check(self, op: Op) -> None:
        memory, redis = self.both(op)
        # refills past a token, or a new UTC day on one store alone, are real differences
        now = time.time()
        if now - self.started > MAX_EXAMPLE_S or now // DAY_S != self.started // DAY_S:
            reject()
        if memory.error is not None or redis.error is not None:
            if memory.error is None or redis.error is None:
                found = [f"memory: {memory}, redis: {redis}"]
            else:
                found = list(error_differences(memory.error, redis.error))
        else:
            found = list(differences(memory.value, redis.value))
        assert not found, f"{op!r}: " + "; ".join(found)
        note(f"{op!r} -> {memory.error!r}" if memory.error else f"{op!r} -> {memory.value!r}")


class TwinStores(RuleBasedStateMachine):
    def __init__(self, runner: asyncio.Runner, prefix: str, client: SyncRedis) -> None:
        super().__init__()
        clock = FakeClock(redis_time(client))
        self.twins = Twins(
            runner, MemoryQuotaStore(clock=clock), RedisQuotaStore(REDIS_URL, prefix=prefix), clock
        )

    @initialize(acme=quotas, beta=quotas)
    def create_tenants(self, acme: TenantQuota, beta: TenantQuota) -> None:
        self.twins.check(Op("create_tenant", ("acme", "Acme", acme)))
        self.twins.check(Op("create_tenant", ("beta", "Beta", beta)))

    @rule(op=ops())
    def one(self, op: Op) -> None:
        self.twins.check(op)

    @rule(burst=st.lists(ops(), min_size=2, max_size=4))
    def burst(self, burst: list[Op]) -> None:
        """Operations with no usage read between them: a lease that ran out is reclaimed by
        the reserve, settle or renew that follows."""
        for op in burst:
            self.twins.check(op)

    @invariant()
    def usage_agrees(self) -> None:
        for tenant_id in TENANTS:
            self.twins.check(Op("usage", (tenant_id,)))

    def teardown(self) -> None:
        self.twins.runner.run(self.twins.redis.aclose())


@pytest.mark.redis
# ~10 s when the stores agree; a divergence is shrunk for up to Hypothesis' 300 s before it is
# reported, and the shortest sequence is what tells which store is wrong
@pytest.mark.timeout(400)
def test_memory_and_redis_stores_answer_alike(redis_prefix: str) -> None:
    examples = itertools.count()
    with (
        asyncio.Runner(loop_factory=TestEventLoop) as runner,
        SyncRedis.from_url(REDIS_URL) as client,
    ):

        class OnePrefixEach(TwinStores):
            def __init__(self) -> None:
                super().__init__(runner, f"{redis_prefix}:{next(examples)}", client)

        run_state_machine_as_test(
            OnePrefixEach,
            settings=settings(
                max_examples=100,
                stateful_step_count=25,
                derandomize=True,
                database=None,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
