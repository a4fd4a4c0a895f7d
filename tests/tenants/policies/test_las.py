import pytest

from tenants.policies import LasPolicy, kv_token_time
from tenants.policies.las import STARVING_OFFSET
from tests.tenants.policies.factories import (
    NO_KNEE,
    dispatch_all,
    make_job,
    make_node,
    make_ready,
    submit,
)


def test_served_jobs_yield_to_fresh_ones_whatever_their_predictions() -> None:
    policy = LasPolicy()
    submit(policy, make_job("old", "t1", [make_node("a", predicted=1), make_node("b")]))
    policy.mark_dispatched("old/a", 0.0)
    policy.on_progress("old/a", 3, 1.0)
    submit(policy, make_job("new", "t2", [make_node("n", predicted=900)], arrival=1.0), now=1.0)
    assert dispatch_all(policy, 1.0) == ["new/n", "old/b"]


def test_a_shared_pool_orders_jobs_by_their_attained_service() -> None:
    policy = LasPolicy()
    submit(policy, make_job("served", "t1", [make_node("a"), make_node("b")]))
    submit(policy, make_job("fresh", "t2"))
    policy.mark_dispatched("served/a", 0.0)
    policy.on_progress("served/a", 7, 1.0)
    assert not policy.by_weight
    assert policy.pool_offsets(["served", "fresh"], 1.0) == {
        "served": kv_token_time(100, 7),
        "fresh": 0.0,
    }


def test_attained_service_is_the_critical_path_not_the_sum() -> None:
    policy = LasPolicy()
    fan = [make_node("x"), make_node("y"), make_node("join", ["x", "y"])]
    submit(policy, make_job("fan", "t1", fan))
    for call_id in dispatch_all(policy):
        policy.on_finished(call_id, 100, 50, 1.0)
    assert policy.attained_service("fan") == kv_token_time(100, 50)
    chain = make_job("chain", "t2", [make_node("p"), make_node("q", ["p"])])
    submit(policy, chain)
    policy.mark_dispatched("chain/p", 1.0)
    policy.on_finished("chain/p", 100, 30, 2.0)
    policy.add_ready(make_ready(chain, "q"), 2.0)
    policy.mark_dispatched("chain/q", 2.0)
    policy.on_progress("chain/q", 30, 3.0)
    assert policy.attained_service("chain") == 2 * kv_token_time(100, 30)
    assert policy.priority("chain/q") == pytest.approx(2 * kv_token_time(100, 30))


@pytest.mark.parametrize(("starvation_wait", "first"), [(10.0, "old/b"), (None, "new/n")])
def test_a_call_waiting_too_long_is_promoted(starvation_wait: float | None, first: str) -> None:
    policy = LasPolicy(starvation_wait=starvation_wait)
    submit(policy, make_job("old", "t1", [make_node("a"), make_node("b")]))
    policy.mark_dispatched("old/a", 0.0)
    policy.on_progress("old/a", 20, 1.0)
    submit(policy, make_job("new", "t2", arrival=11.0), now=11.0)
    peeked = policy.peek(11.0, NO_KNEE)
    assert peeked is not None and peeked.call_id == first


def test_a_starving_job_comes_first_in_a_shared_pool_the_longest_starving_first() -> None:
    policy = LasPolicy(starvation_wait=10.0)
    submit(policy, make_job("old", "t1", [make_node("a"), make_node("b")]))  # b ready at 0
    submit(policy, make_job("older", "t3", [make_node("c"), make_node("d")]))
    policy.mark_dispatched("old/a", 0.0)
    policy.on_progress("old/a", 20, 1.0)
    policy.mark_dispatched("older/c", 0.0)
    submit(policy, make_job("new", "t2", arrival=11.0), now=11.0)
    assert policy.pool_offsets(["old"], 5.0) == {"old": kv_token_time(100, 20)}  # not yet
    offsets = policy.pool_offsets(["old", "older", "new"], 11.0)
    # both starve since 0 (their ready calls came with them): below every attained service,
    # ties kept as the policy keeps them
    assert offsets["old"] == offsets["older"] == STARVING_OFFSET
    assert offsets["new"] == 0.0 and offsets["old"] < offsets["new"]
