"""Overload control's pure parts: how often the monitor is ticked, and when a level falls."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.backends import BackendCapacity
from gateway.dispatch_core import DispatchCore
from gateway.lanes import Lane
from gateway.overload import SHRUNK_BATCH, TICK_S, OverloadControl, ShedJob, tick_interval
from gateway.slo import SloConfig, SloTarget
from tenants.policies import JobInfo, NodeCost, ReadyCall, make_policy


def test_short_ticks_come_every_tick_period() -> None:
    assert tick_interval(0.0) == tick_interval(TICK_S / 20) == TICK_S


@pytest.mark.parametrize("spent", [0.05, 0.2, 1.0])
def test_long_ticks_take_a_tenth_of_the_time_at_most(spent: float) -> None:
    interval = tick_interval(spent)
    assert interval > TICK_S
    assert spent / (spent + interval) == pytest.approx(0.1)


def first_token(control: OverloadControl, call_id: str, ttft_s: float, now: float) -> None:
    """A protected call's first token, as the dispatcher reports it."""
    control._apply(control.monitor.first_token(call_id, "t", False, ttft_s, now))


class Serving:
    """A backend that shows the same room whenever asked."""

    def __init__(self, room: BackendCapacity) -> None:
        self.name, self.room = "x", room

    def capacity(self) -> BackendCapacity:
        return self.room


@pytest.mark.parametrize("busy", [8, 7, 6, 0])
def test_a_busy_pool_holding_nothing_back_lets_the_level_fall(busy: int) -> None:
    """Past level 1 a pool with no more free slots than the reserve kept the level up, misses
    or not: a well-used pool stayed at the level it once reached (at level 2 a quarter of
    every batch idle for good, at 3 new jobs refused while most slots were busy)."""
    now = [0.0]
    room = BackendCapacity(1000, 16, free_slots=8 - busy, running=busy, waiting=0, healthy=True)
    lane = Lane("m", {"x": Serving(room)}, DispatchCore(make_policy("justitia")), None)  # type: ignore[dict-item]
    config = SloConfig(
        (SloTarget("*", ttft_s=1.0, tpot_s=0.1),),
        window_s=10.0, threshold=0.2, min_calls=5, hold_s=2.0, rise_s=0.25,
    )  # fmt: skip
    control = OverloadControl(config, [lane], lambda: now[0], lambda: None)
    for i in range(10):  # a burst of first tokens far past their target: the level rises
        now[0] = 0.01 * i
        first_token(control, f"late{i}", 5.0, now[0])
    assert control.level >= 1
    for i in range(1200):  # two minutes of first tokens on time, nothing waiting
        now[0] = 1.0 + 0.1 * i
        first_token(control, f"on-time{i}", 0.05, now[0])
        control.tick()
    assert control.level == 0 and lane.core.batch_fraction == 1.0


CONFIG = SloConfig(
    (SloTarget("*", ttft_s=1.0, tpot_s=0.1),),
    window_s=10.0, threshold=0.2, min_calls=5, hold_s=2.0, rise_s=0.25,
)  # fmt: skip


def overloaded(room: BackendCapacity | None = None) -> tuple[OverloadControl, Lane, list[float]]:
    """A pool of 16 slots whose level a burst of late first tokens raised to 3."""
    now = [0.0]
    room = room or BackendCapacity(1000, 16, free_slots=16, running=0, waiting=0, healthy=True)
    lane = Lane("m", {"x": Serving(room)}, DispatchCore(make_policy("justitia")), None)  # type: ignore[dict-item]
    control = OverloadControl(CONFIG, [lane], lambda: now[0], lambda: None)
    for i in range(10):
        now[0] = 0.3 * i
        first_token(control, f"late{i}", 5.0, now[0])
    assert control.level == 3
    return control, lane, now


def test_the_batch_shrinks_once_per_token_times_miss_at_a_level_that_holds() -> None:
    """Level 3 reached on late first tokens (no shrink: it would only lengthen their queue),
    then held while the misses turn to per-token ones: whether to shrink was decided only when
    the level changed, so the batch stayed full for as long as the level held."""
    control, lane, now = overloaded()
    assert lane.core.batch_fraction == 1.0
    for k in range(100):  # 5 s: 3 calls in 10 stream too slowly, first tokens on time
        now[0] = 3.0 + 0.05 * k
        first_token(control, f"c{k}", 0.05, now[0])
        tpot = 0.5 if k % 10 < 3 else 0.01
        control._apply(control.monitor.ended(f"c{k}", "t", False, tpot, now[0], ""))
        control.tick()
    assert control.monitor.tokens_slow(now[0])
    assert control.level == 3 and lane.core.batch_fraction == SHRUNK_BATCH


def at_reserve_with_a_sheddable_backlog() -> tuple[OverloadControl, Lane, list[float]]:
    """An overloaded pool whose free slots are level 1's reserve, a batch tenant's sheddable
    call waiting for room."""
    at_reserve = BackendCapacity(1000, 16, free_slots=4, running=12, waiting=0, healthy=True)
    control, lane, now = overloaded(at_reserve)
    node = SimpleNamespace(first_token_at=None, ready_at=now[0])
    job = SimpleNamespace(nodes={"n": node}, spec=SimpleNamespace(sheddable=True))
    call = ReadyCall("batch/n", "batch", "batch", "n", 16, 16.0, 64)
    lane.core.add_job(
        JobInfo("batch", "batch", 1.0, now[0], (NodeCost("n", (), 16, 16.0, 64),), -1), now[0]
    )
    lane.core.add_ready(call, 16, SimpleNamespace(run=job, call=call), now[0], sheddable=True)  # type: ignore[arg-type]
    return control, lane, now


def test_a_sheddable_backlog_alone_lets_the_level_fall() -> None:
    """Sheddable calls filling every slot but the reserve counted as the level acting, with no
    protected call anywhere: a batch tenant's backlog held the gateway at the refusing level
    (a quarter of the slots idle) for good."""
    control, lane, now = at_reserve_with_a_sheddable_backlog()
    for i in range(1200):  # two minutes with no protected call
        now[0] = 3.0 + 0.1 * i
        control.tick()
    assert control.level == 0 and lane.core.sheddable_reserve == 0.0


@pytest.mark.parametrize(("roots", "sheddable", "free"), [(13, False, 16), (4, True, 2)])
def test_refusals_that_no_load_explains_do_not_hold_the_refusing_level(
    roots: int, sheddable: bool, free: int
) -> None:
    """A job wanting more first calls than 3/4 of the pool's 16 slots is refused at level 3
    even on an idle pool, and a sheddable job's refusal turns away no protected load: each
    refusal kept the level up, so one client retrying held every tenant at it."""
    room = BackendCapacity(1000, 16, free_slots=free, running=16 - free, waiting=0, healthy=True)
    control, _, now = overloaded(room)
    refused = 0
    for i in range(1200):  # two minutes; a client retries every 1.5 s
        now[0] = 3.0 + 0.1 * i
        if i % 15 == 0:
            try:
                with control.admission(
                    Counter({"m": roots}), sheddable=sheddable, tenant="t", weight=1.0
                ):
                    pass
            except ShedJob:
                refused += 1
        control.tick()
    assert refused > 0 and control.level == 0


def test_a_protected_job_refused_for_the_load_holds_the_refusing_level() -> None:
    busy = BackendCapacity(1000, 16, free_slots=2, running=14, waiting=0, healthy=True)
    control, _, now = overloaded(busy)
    for i in range(100):  # ten seconds of a client retrying a job that would fit an idle pool
        now[0] = 3.0 + 0.1 * i
        with (
            pytest.raises(ShedJob),
            control.admission(Counter({"m": 4}), False, tenant="t", weight=1.0),
        ):
            pass
        control.tick()
    assert control.level == 3


class Named:
    def __init__(self, name: str, room: BackendCapacity) -> None:
        self.name, self.room = name, room

    def capacity(self) -> BackendCapacity:
        return self.room


def test_a_job_too_wide_for_two_shrunk_backends_does_not_hold_the_refusing_level() -> None:
    """Two idle backends of 5 slots have 3 + 3 within the shrunk batch (each rounded down), yet
    the refusal's "wider than the pool" check rounded their sum (7): a 7-root job refused on an
    idle pool still counted as the level acting."""
    now = [0.0]
    idle = BackendCapacity(1000, 16, free_slots=5, running=0, waiting=0, healthy=True)
    backends = {"a": Named("a", idle), "b": Named("b", idle)}
    lane = Lane("m", backends, DispatchCore(make_policy("justitia")), None)  # type: ignore[arg-type]
    control = OverloadControl(CONFIG, [lane], lambda: now[0], lambda: None)
    for i in range(10):
        now[0] = 0.3 * i
        first_token(control, f"late{i}", 5.0, now[0])
    assert control.level == 3
    refused = 0
    for i in range(1200):  # two minutes; one client retries a 7-root job every 1.5 s
        now[0] = 3.0 + 0.1 * i
        if i % 15 == 0:
            try:
                with control.admission(Counter({"m": 7}), False, tenant="t", weight=1.0):
                    pass
            except ShedJob:
                refused += 1
        control.tick()
    assert refused > 0  # on an idle pool (6 spare < 7): no load explains it
    assert control.level == 0, f"level held at {control.level} by an unadmittable job's retries"


def ready_calls(lane: Lane, job: str, tenant: str, n: int, ready_at: float) -> list[Any]:
    """`n` protected ready calls of one job in the lane, ready since `ready_at`."""
    nodes = {f"n{i}": SimpleNamespace(first_token_at=None, ready_at=ready_at) for i in range(n)}
    run = SimpleNamespace(nodes=nodes, spec=SimpleNamespace(sheddable=False))
    costs = tuple(NodeCost(f"n{i}", (), 16, 16.0, 64) for i in range(n))
    lane.core.add_job(JobInfo(job, tenant, 1.0, ready_at, costs), ready_at)
    tickets = []
    for i in range(n):
        call = ReadyCall(f"{job}/n{i}", job, tenant, f"n{i}", 16, 16.0, 64)
        ticket = SimpleNamespace(run=run, call=call, model_name=lane.model)
        lane.core.add_ready(call, 16, ticket, ready_at)  # type: ignore[arg-type]
        tickets.append(ticket)
    return tickets


def test_a_quota_refusal_of_one_call_does_not_hide_the_wait_of_a_call_sent_before() -> None:
    """A tenant's call sent at 0.1 s waits for its first token while its other call is refused
    by its concurrency quota every second: the wait of every call of the tenant began at the
    newest hold's end, so the sent call, 4.4 s without a token (target 2 s), was never judged
    overdue."""
    config = SloConfig((SloTarget("*", ttft_s=2.0),), window_s=10.0, threshold=0.2, min_calls=5)
    now = [0.0]
    idle = BackendCapacity(1000, 16, free_slots=16, running=0, waiting=0, healthy=True)
    lane = Lane("m", {"x": Serving(idle)}, DispatchCore(make_policy("justitia")), None)  # type: ignore[dict-item]
    control = OverloadControl(config, [lane], lambda: now[0], lambda: None)
    ready_calls(lane, "j", "t", 2, ready_at=0.0)
    sent = lane.core.next(0.1, lane.capacities())
    assert sent is not None and lane.core.launched(sent.entry.call.call_id, 0.1) is not None
    for t in (1.0, 2.0, 3.0, 4.0):
        refused = lane.core.next(t, lane.capacities())
        assert refused is not None and refused.entry is not sent.entry
        lane.core.retry_later(refused.entry.call.call_id, t + 1.0)  # QUOTA_CONCURRENT_CALLS
        for k in range(10):
            now[0] = t + 0.1 * k
            control.tick()
    # the sent call is overdue; the refused one, its quota holding it, is not judged
    assert control.monitor.overdue_calls == 1


def ended_call(control: OverloadControl, pool: str, call_id: str) -> None:
    """A protected call of `pool` ended, as the dispatcher reports it."""
    call = SimpleNamespace(call_id=call_id, tenant_id="x")
    run = SimpleNamespace(spec=SimpleNamespace(sheddable=False))
    control.ended(SimpleNamespace(call=call, run=run, model_name=pool), None)  # type: ignore[arg-type]


def test_a_pool_s_queue_is_no_wait_for_another_pool_s_calls() -> None:
    """Pools serve different models on different backends, yet every pool's waiting calls made
    one queue, turned at the rate calls ended in all of them: a call alone in its pool's queue
    for 0.1 s (a turn of 1 s there) was judged behind another pool's backlog of 20, a miss at
    once."""
    config = SloConfig((SloTarget("*", ttft_s=2.0),), window_s=10.0, threshold=0.2, min_calls=5)
    now = [0.0]
    full = BackendCapacity(1000, 16, free_slots=0, running=16, waiting=0, healthy=True)
    lanes = [
        Lane(m, {m: Named(m, full)}, DispatchCore(make_policy("justitia")), None)  # type: ignore[dict-item]
        for m in ("a", "b")
    ]
    control = OverloadControl(config, lanes, lambda: now[0], lambda: None)
    for i in range(10):  # each pool: a call ended every second over the window
        now[0] = float(i)
        ended_call(control, "a", f"a{i}")
        ended_call(control, "b", f"b{i}")
    ready_calls(lanes[0], "ja", "ta", 20, ready_at=0.0)  # pool a's backlog, queued since 0
    ready_calls(lanes[1], "jb", "tb", 1, ready_at=9.9)  # alone in pool b's queue
    now[0] = 10.0
    control.tick()
    assert control.monitor.overdue_calls == 20  # pool a's, and not pool b's


def test_a_tenant_s_backlog_beyond_its_share_is_no_queue_for_another_tenant_s_job() -> None:
    """One tenant's calls run in half the pool and 30 more wait (the room is full of their KV):
    they miss their target and raise the refusing level. The refusal counted every tenant's
    waiting calls as taking the free slots first, so a light tenant's one-call job was refused
    (and the refusal held the level for everyone), though the fair order runs its call before
    the backlog of a tenant past its share (and the backlog could not use those slots)."""
    now = [0.0]
    idle = BackendCapacity(1000, 16, free_slots=16, running=0, waiting=0, healthy=True)
    serving = Serving(idle)
    lane = Lane("m", {"x": serving}, DispatchCore(make_policy("justitia")), None)  # type: ignore[dict-item]
    control = OverloadControl(CONFIG, [lane], lambda: now[0], lambda: None)
    ready_calls(lane, "hj", "hog", 38, ready_at=0.0)
    for _ in range(8):
        sent = lane.core.next(0.0, lane.capacities())
        assert sent is not None and lane.core.launched(sent.entry.call.call_id, 0.0) is not None
    serving.room = BackendCapacity(0, 16, free_slots=8, running=8, waiting=0, healthy=True)
    for i in range(10):
        now[0] = 0.3 * i
        first_token(control, f"late{i}", 5.0, now[0])
    assert control.level == 3
    with control.admission(Counter({"m": 1}), sheddable=False, tenant="light", weight=1.0):
        pass  # admitted: its call runs before hog's backlog
    with (
        pytest.raises(ShedJob),
        control.admission(Counter({"m": 1}), sheddable=False, tenant="hog", weight=1.0),
    ):
        pass  # hog's own backlog is its new job's queue


def test_a_sheddable_backlog_beside_calls_on_time_lets_the_refusing_level_fall() -> None:
    """Level 3 keeps a quarter of the slots from sheddable calls, so with a sheddable backlog
    the free slots never passed its own reserve: that counted as the level acting, and with
    protected calls on time (no miss for two minutes) one batch tenant held every tenant at
    the refusing level for good."""
    control, _, now = at_reserve_with_a_sheddable_backlog()
    for i in range(1200):  # two minutes of protected first tokens on time
        now[0] = 3.0 + 0.1 * i
        first_token(control, f"on-time{i}", 0.05, now[0])
        control.tick()
    assert control.monitor.violation_rate(now[0]) == 0.0
    assert control.level < 3, "the refusing level held by its own reserve, with no miss"
