"""Overload control's pure parts: how often the monitor is ticked, and when a level falls."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from gateway.backends import BackendCapacity
from gateway.dispatch_core import DispatchCore
from gateway.lanes import Lane
from gateway.overload import TICK_S, OverloadControl, ShedJob, tick_interval
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


def test_a_sheddable_backlog_alone_lets_the_level_fall() -> None:
    """Sheddable calls filling every slot but the reserve counted as the level acting, with no
    protected call anywhere: a batch tenant's backlog held the gateway at the refusing level
    (a quarter of the slots idle) for good."""
    at_reserve = BackendCapacity(1000, 16, free_slots=4, running=12, waiting=0, healthy=True)
    control, lane, now = overloaded(at_reserve)
    node = SimpleNamespace(first_token_at=None, ready_at=now[0])
    job = SimpleNamespace(nodes={"n": node}, spec=SimpleNamespace(sheddable=True))
    call = ReadyCall("batch/n", "batch", "batch", "n", 16, 16.0, 64)
    lane.core.add_job(
        JobInfo("batch", "batch", 1.0, now[0], (NodeCost("n", (), 16, 16.0, 64),), -1), now[0]
    )
    lane.core.add_ready(call, 16, SimpleNamespace(run=job, call=call), now[0], sheddable=True)  # type: ignore[arg-type]
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
                with control.admission(Counter({"m": roots}), sheddable=sheddable):
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
        with pytest.raises(ShedJob), control.admission(Counter({"m": 4}), sheddable=False):
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
                with control.admission(Counter({"m": 7}), sheddable=False):
                    pass
            except ShedJob:
                refused += 1
        control.tick()
    assert refused > 0  # on an idle pool (6 spare < 7): no load explains it
    assert control.level == 0, f"level held at {control.level} by an unadmittable job's retries"
