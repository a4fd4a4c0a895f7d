from tenants.policies import FcfsPolicy
from tests.tenants.policies.factories import dispatch_all, make_job, make_node, make_ready, submit


def test_older_jobs_go_first_even_when_their_calls_become_ready_later() -> None:
    policy = FcfsPolicy()
    old = make_job("old", nodes=[make_node("a"), make_node("b", ["a"])], arrival=0.0)
    submit(policy, old)
    submit(policy, make_job("new", "t2", arrival=1.0), now=1.0)
    policy.mark_dispatched("old/a", 1.0)
    policy.on_finished("old/a", 100, 50, 2.0)
    policy.add_ready(make_ready(old, "b"), 2.0)
    assert dispatch_all(policy, 2.0) == ["old/b", "new/n"]


def test_calls_of_a_job_and_of_simultaneous_jobs_go_in_readiness_order() -> None:
    policy = FcfsPolicy()
    x = make_job("x", nodes=[make_node("p"), make_node("q")], arrival=5.0)
    y = make_job("y", "t2", arrival=5.0)
    policy.add_job(x, 5.0)
    policy.add_job(y, 5.0)
    policy.add_ready(make_ready(x, "q"), 5.0)
    policy.add_ready(make_ready(y), 5.0)
    policy.add_ready(make_ready(x, "p"), 5.0)
    assert dispatch_all(policy, 5.0) == ["x/q", "y/n", "x/p"]


def test_later_jobs_are_preempted_first() -> None:
    policy = FcfsPolicy()
    submit(policy, make_job("early", arrival=1.0), now=1.0)
    submit(policy, make_job("late", arrival=2.0), now=2.0)
    dispatch_all(policy, 2.0)
    assert policy.priority("early/n") < policy.priority("late/n")


def test_a_shared_pool_orders_jobs_by_their_arrival() -> None:
    policy = FcfsPolicy()
    submit(policy, make_job("early", arrival=1.0), now=1.0)
    submit(policy, make_job("late", "t2", arrival=4.0), now=4.0)
    assert not policy.by_weight  # nothing charged by weight: the arrival is the whole key
    assert policy.pool_offsets(["late", "early"], 4.0) == {"late": 4.0, "early": 1.0}
