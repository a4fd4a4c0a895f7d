import pytest

from tenants.policies import InvalidJob, NodeCost, SjfOraclePolicy, kv_token_time
from tests.tenants.policies.factories import NO_KNEE, dispatch_all, make_job, make_node, submit


def test_true_lengths_decide_not_predictions() -> None:
    policy = SjfOraclePolicy()
    submit(policy, make_job("looks-short", "t1", [make_node("n", predicted=5, true=300)]))
    submit(policy, make_job("looks-long", "t2", [make_node("n", predicted=300, true=5)]))
    assert dispatch_all(policy) == ["looks-long/n", "looks-short/n"]


def test_served_work_shortens_the_remaining_cost() -> None:
    policy = SjfOraclePolicy()
    chain = [make_node("n1", true=50), make_node("n2", ["n1"], true=10)]
    submit(policy, make_job("chain", "t1", chain))
    submit(policy, make_job("single", "t2", [make_node("n", true=30)]))
    assert policy.remaining_cost("chain") == kv_token_time(100, 50) + kv_token_time(100, 10)
    policy.mark_dispatched("chain/n1", 0.0)
    assert policy.priority("chain/n1") > policy.priority("single/n")
    policy.on_progress("chain/n1", 45, 1.0)
    left = kv_token_time(100, 50) - kv_token_time(100, 45) + kv_token_time(100, 10)
    assert policy.remaining_cost("chain") == pytest.approx(left)
    assert policy.priority("chain/n1") < policy.priority("single/n")


def test_needs_true_lengths() -> None:
    node = NodeCost("n", (), prompt_tokens=10, predicted_output=5, max_tokens=50)
    with pytest.raises(InvalidJob):
        SjfOraclePolicy().add_job(make_job("j", nodes=[node]), 0.0)


def test_a_stream_of_small_jobs_starves_a_big_one() -> None:
    policy = SjfOraclePolicy()
    submit(policy, make_job("big", "heavy", [make_node("n", true=200)]))
    for i in range(200):
        submit(policy, make_job(f"s{i}", "light", [make_node("n", true=20)]), now=float(i))
        call = policy.peek(float(i), NO_KNEE)
        assert call is not None and call.job_id == f"s{i}"
        policy.mark_dispatched(call.call_id, float(i))
        policy.on_finished(call.call_id, 100, 20, float(i))
        policy.remove_job(call.job_id, float(i))
