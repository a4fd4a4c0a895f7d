"""The recent-calls window: sums, nearest-rank percentiles, expiry and its bounds."""

from __future__ import annotations

import math
import random

import pytest

from gateway.job_run import NodeRun
from gateway.jobs.model import NodeSpec
from gateway.recent import Latencies, RecentCalls, TenantWindow, percentile
from tenants.policies import kv_token_time


def test_a_window_sums_service_and_ranks_latencies() -> None:
    recent = RecentCalls(window_s=60.0)
    for i in range(1, 101):
        recent.add("alpha", 1000.0 + i * 0.1, 10.0, ttft_s=i / 1000, queue_wait_s=i / 100)
    recent.add("beta", 1005.0, 30.0)
    view = recent.view(1010.0)
    assert view == {"alpha": TenantWindow(1000.0, 100), "beta": TenantWindow(30.0, 1)}
    assert recent.latencies("alpha", 1010.0) == Latencies(0.05, 0.099, 0.5, 0.99)
    assert recent.latencies("beta", 1010.0) == Latencies()  # no first token, no wait known
    assert recent.latencies("nobody", 1010.0) == Latencies()


def test_calls_leave_the_window_and_an_idle_tenant_is_forgotten() -> None:
    recent = RecentCalls(window_s=10.0)
    recent.add("alpha", 100.2, 5.0, ttft_s=1.0)
    recent.add("alpha", 105.5, 7.0, ttft_s=2.0)
    assert recent.view(110.5)["alpha"] == TenantWindow(12.0, 2)  # second 100 is still in
    assert recent.latencies("alpha", 110.5).ttft_p50_s == 2.0  # the sample itself is not
    assert recent.view(111.1)["alpha"] == TenantWindow(7.0, 1)
    assert recent.view(116.0) == {}


def test_latency_samples_and_tenants_are_bounded() -> None:
    recent = RecentCalls(window_s=60.0, max_samples=4, max_tenants=2)
    for i in range(10):
        recent.add("alpha", 10.0 + i, 1.0, ttft_s=float(i))
    assert recent.view(20.0)["alpha"].calls == 10
    latest = recent.latencies("alpha", 20.0)  # of the newest 4
    assert (latest.ttft_p50_s, latest.ttft_p99_s) == (7.0, 9.0)
    recent.add("beta", 20.0, 1.0)
    recent.add("alpha", 20.5, 1.0)
    recent.add("gamma", 21.0, 1.0)  # beta was the least recently active
    assert sorted(recent.view(21.0)) == ["alpha", "gamma"]


def test_a_call_is_recorded_from_its_node() -> None:
    recent = RecentCalls()
    node = NodeRun(NodeSpec(id="n", prompt_template="hi"), prompt_tokens=10)
    recent.call_ended("alpha", node, 0)  # never started: it held nothing
    assert recent.view(0.0) == {}
    node.ready_at, node.started_at, node.first_token_at, node.finished_at = 1.0, 1.5, 1.75, 3.0
    recent.call_ended("alpha", node, 4)
    assert recent.view(3.0)["alpha"] == TenantWindow(kv_token_time(10, 4), 1)
    assert recent.latencies("alpha", 3.0) == Latencies(0.75, 0.75, 0.5, 0.5)


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([1.0, 2.0], 0.5) == 1.0
    assert percentile([1.0, 2.0, 3.0], 0.99) == 3.0
    with pytest.raises(ValueError):
        RecentCalls(window_s=0)


def test_blast_the_window_agrees_with_a_brute_force_count() -> None:
    rng = random.Random(17)
    recent = RecentCalls(window_s=5.0, max_samples=16, max_tenants=3)
    tenants = ["a", "b", "c"]
    calls: list[tuple[str, float, float, float]] = []
    now = 0.0
    for _ in range(3000):
        now += rng.expovariate(20.0)
        if rng.random() < 0.9:
            tenant, kv, ttft = rng.choice(tenants), float(rng.randint(0, 50)), rng.random()
            recent.add(tenant, now, kv, ttft_s=ttft)
            calls.append((tenant, now, kv, ttft))
            continue
        view = recent.view(now)
        for tenant in tenants:
            # a second's sum stays while part of that second is in the window
            kept = [c for c in calls if c[0] == tenant and math.floor(c[1]) + 1 > now - 5.0]
            latest = [c[3] for c in calls if c[0] == tenant and c[1] >= now - 5.0][-16:]
            if not kept:
                assert tenant not in view
                continue
            got = view[tenant]
            assert got.calls == len(kept)
            assert got.served_kv_token_steps == pytest.approx(sum(c[2] for c in kept))
            assert recent.latencies(tenant, now).ttft_p99_s == percentile(sorted(latest), 0.99)
