"""A tenant's share of the event loop for its requests' work, on an injected clock."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from gateway.errors import LoopThrottled
from gateway.loop_budget import FREE_S, WINDOW_S, LoopBudget
from tests.fake_clock import FakeClock


def _spend(budget: LoopBudget, clock: FakeClock, tenant: str, seconds: float) -> None:
    with budget.spending(tenant):
        clock.now += seconds


def test_a_tenant_past_its_share_waits_until_it_refills_and_others_do_not() -> None:
    clock = FakeClock(0.0)
    budget = LoopBudget(share=0.05, clock=clock, timer=clock)  # holds 1 s
    _spend(budget, clock, "alpha", 0.9)
    _spend(budget, clock, "alpha", 2.1)  # one request may take as long as it takes
    with pytest.raises(LoopThrottled) as caught:
        _spend(budget, clock, "alpha", 0.001)
    # 1 - 0.9, then 2.1 s refilling 0.105 as it took 2.1: 1.895 s short, at 0.05 s a second
    # (each piece charged beyond its first FREE_S)
    short = 1.895 - 2 * FREE_S
    assert caught.value.retry_after_s == pytest.approx(short / 0.05)
    _spend(budget, clock, "beta", 0.5)
    clock.now += short / 0.05
    _spend(budget, clock, "alpha", 0.001)


def test_a_refused_piece_costs_nothing_and_a_failed_one_is_charged() -> None:
    clock = FakeClock(0.0)
    budget = LoopBudget(share=0.1, clock=clock, timer=clock)  # holds 2 s
    with pytest.raises(ValueError), budget.spending("alpha"):
        clock.now += 2.5
        raise ValueError("does not parse")
    for _ in range(3):
        with pytest.raises(LoopThrottled) as caught:
            _spend(budget, clock, "alpha", 10.0)
        assert caught.value.retry_after_s == pytest.approx((0.5 - FREE_S) / 0.1)  # unchanged
    clock.now += 10 * WINDOW_S  # idle time fills it to its share of the window, no more
    _spend(budget, clock, "alpha", 3.0)
    with pytest.raises(LoopThrottled) as caught:
        _spend(budget, clock, "alpha", 0.1)
    assert caught.value.retry_after_s == pytest.approx((1.0 - FREE_S) / 0.1)


def test_ordinary_pieces_are_free_however_many() -> None:
    """A tenant alone on a replica sending many small jobs may use all of its loop: charging
    each request's tens of microseconds capped its rate at its share with the loop idle."""
    clock = FakeClock(0.0)
    budget = LoopBudget(share=0.05, clock=clock, timer=clock)  # holds 1 s
    for _ in range(10_000):  # 10 s of work in 10 s: all of the loop
        _spend(budget, clock, "alpha", FREE_S)
    _spend(budget, clock, "alpha", 0.9 + FREE_S)  # its whole share is still there
    _spend(budget, clock, "alpha", 0.2)
    with pytest.raises(LoopThrottled):
        _spend(budget, clock, "alpha", FREE_S)


def _python_work() -> None:
    total = 0
    for i in range(200_000):  # ~6 ms on these machines, holding the GIL
        total += i


def test_time_the_loop_thread_did_not_run_is_not_charged() -> None:
    """A piece of a tenant's work waits while another thread holds the GIL (an engine's steps,
    gRPC's threads) or the OS runs another process: on the wall clock that wait was charged to
    the tenant, and a tenant sending ordinary jobs alone was refused on a busy machine. Here
    each piece waits for another thread's Python work: several times the tenant's burst of
    such waits, and none of it charged."""
    budget = LoopBudget(share=0.001)  # holds 20 ms, timed by the loop thread's CPU time
    for _ in range(20):
        other = threading.Thread(target=_python_work)
        with budget.spending("alpha"):
            other.start()
            other.join()
    budget.check("alpha")


def test_the_collector_s_full_passes_are_not_charged() -> None:
    """A full pass of the garbage collector costs about the whole heap and falls in whichever
    piece allocated last: charged, two of them (0.3 s each in the test process) took most of
    a tenant's share though it sent only ordinary jobs."""
    budget = LoopBudget(share=0.001)  # holds 20 ms
    heap = [(i,) for i in range(300_000)]
    passes_s = 0.0
    while passes_s < 0.1:  # five times the tenant's burst
        with budget.spending("alpha"):
            began = time.thread_time()
            gc.collect()
            passes_s += time.thread_time() - began
    budget.check("alpha")
    del heap
