import math
from dataclasses import replace

import pytest

from tenants.policies import (
    POLICY_NAMES,
    CallNotFound,
    CallNotReady,
    CallNotRunning,
    DuplicateCall,
    DuplicateJob,
    InvalidCall,
    InvalidJob,
    InvalidProgress,
    JobInfo,
    JobNotFound,
    Policy,
    UnknownPolicy,
    kv_token_time,
    make_policy,
)
from tests.tenants.policies.factories import (
    NO_KNEE,
    dispatch_all,
    make_job,
    make_node,
    make_ready,
    submit,
)


@pytest.fixture(params=POLICY_NAMES)
def policy(request: pytest.FixtureRequest) -> Policy:
    return make_policy(request.param)


def test_kv_token_time_sums_the_kv_held_at_each_decode_step() -> None:
    assert kv_token_time(10, 3) == 11 + 12 + 13
    assert kv_token_time(0, 1) == 1
    assert kv_token_time(7, 0) == 0


def test_make_policy_names_every_policy_and_rejects_others() -> None:
    assert {make_policy(name).name for name in POLICY_NAMES} == {
        "fcfs",
        "vtc",
        "justitia",
        "sjf-oracle",
        "las",
    }
    with pytest.raises(UnknownPolicy):
        make_policy("round-robin")


@pytest.mark.parametrize(
    "job",
    [
        make_job("j", weight=0.0),
        make_job("j", nodes=[make_node("a"), make_node("a")]),
        make_job("j", nodes=[make_node("a", ["b"]), make_node("b", ["a"])]),
        make_job("j", nodes=[make_node("a", ["missing"])]),
        make_job("j", nodes=[make_node("a", ["a"])]),
        make_job("j", nodes=[make_node("a", prompt=-1)]),
    ],
)
def test_invalid_jobs_are_rejected(policy: Policy, job: JobInfo) -> None:
    with pytest.raises(InvalidJob):
        policy.add_job(job, 0.0)


def test_a_job_is_added_once(policy: Policy) -> None:
    policy.add_job(make_job("j"), 0.0)
    with pytest.raises(DuplicateJob):
        policy.add_job(make_job("j"), 1.0)


def test_ready_calls_must_fit_their_job(policy: Policy) -> None:
    job = make_job("j", nodes=[make_node("a"), make_node("b", ["a"])])
    with pytest.raises(JobNotFound):
        policy.add_ready(make_ready(job, "a"), 0.0)
    policy.add_job(job, 0.0)
    other_tenant = make_job("j", "t2", nodes=job.nodes)
    with pytest.raises(InvalidCall):
        policy.add_ready(make_ready(other_tenant, "a"), 0.0)
    policy.add_ready(make_ready(job, "a"), 0.0)
    with pytest.raises(DuplicateCall):
        policy.add_ready(make_ready(job, "a"), 0.0)
    with pytest.raises(InvalidCall):  # the node is already ready under another call id
        policy.add_ready(replace(make_ready(job, "a"), call_id="x"), 0.0)
    with pytest.raises(InvalidCall):
        policy.add_ready(replace(make_ready(job, "a"), call_id="y", node_id="zz"), 0.0)


def test_call_lifecycle_is_enforced(policy: Policy) -> None:
    job = make_job("j")
    submit(policy, job)
    call = make_ready(job)
    with pytest.raises(CallNotRunning):
        policy.on_progress(call.call_id, 1, 0.0)
    policy.on_refined(call.call_id, 10.0, 0.0)  # a ready call may be predicted again
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(InvalidProgress):
            policy.on_refined(call.call_id, bad, 0.0)
    policy.mark_dispatched(call.call_id, 0.0)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(InvalidProgress):
            policy.on_refined(call.call_id, bad, 0.0)
    with pytest.raises(CallNotReady):
        policy.mark_dispatched(call.call_id, 0.0)
    policy.on_progress(call.call_id, 5, 0.0)
    with pytest.raises(InvalidProgress):
        policy.on_progress(call.call_id, 4, 0.0)
    policy.on_finished(call.call_id, call.prompt_tokens, 6, 0.0)
    with pytest.raises(CallNotFound):
        policy.priority(call.call_id)
    with pytest.raises(CallNotFound):
        policy.on_refined(call.call_id, 10.0, 0.0)
    with pytest.raises(CallNotRunning):
        policy.on_finished(call.call_id, call.prompt_tokens, 6, 0.0)


def test_peek_is_pure_and_none_when_nothing_is_ready(policy: Policy) -> None:
    assert policy.peek(0.0, NO_KNEE) is None
    submit(policy, make_job("a", nodes=[make_node("x"), make_node("y")]))
    submit(policy, make_job("b", "t2", arrival=1.0), now=1.0)
    first = policy.peek(2.0, NO_KNEE)
    assert first is not None and policy.peek(2.0, NO_KNEE) == first
    assert sorted(dispatch_all(policy, 2.0)) == ["a/x", "a/y", "b/n"]
    assert policy.peek(2.0, NO_KNEE) is None


def test_remove_job_forgets_its_ready_and_running_calls(policy: Policy) -> None:
    job = make_job("j", nodes=[make_node("x"), make_node("y")])
    submit(policy, job)
    policy.mark_dispatched("j/x", 0.0)
    policy.remove_job("j", 1.0)
    assert policy.peek(1.0, NO_KNEE) is None
    for call_id in ("j/x", "j/y"):
        with pytest.raises(CallNotFound):
            policy.priority(call_id)
    with pytest.raises(JobNotFound):
        policy.remove_job("j", 1.0)
    policy.add_job(job, 2.0)  # the id is free again


def test_priorities_cover_ready_and_running_calls(policy: Policy) -> None:
    job = make_job("j", nodes=[make_node("x"), make_node("y")])
    submit(policy, job)
    policy.mark_dispatched("j/x", 0.0)
    assert isinstance(policy.priority("j/x"), float)
    assert isinstance(policy.priority("j/y"), float)


def test_a_held_call_stays_ready_but_is_not_shown(policy: Policy) -> None:
    a, b = make_job("a", "t1"), make_job("b", "t2")
    submit(policy, a)
    submit(policy, b)
    first = policy.peek(0.0, NO_KNEE)
    assert first is not None
    policy.hold(first.call_id)
    second = policy.peek(0.0, NO_KNEE)
    assert second is not None and second.call_id != first.call_id
    policy.hold(second.call_id)
    assert policy.peek(0.0, NO_KNEE) is None
    with pytest.raises(DuplicateCall):  # still ready: nothing is added twice
        policy.add_ready(first, 0.0)
    policy.unhold(first.call_id)
    assert policy.peek(0.0, NO_KNEE) == first
    policy.mark_dispatched(first.call_id, 0.0)  # dispatching a held call is allowed
    policy.check_invariants()  # type: ignore[attr-defined]


def test_a_held_tenant_is_skipped_until_its_time(policy: Policy) -> None:
    a, b = make_job("a", "t1"), make_job("b", "t2")
    submit(policy, a)
    submit(policy, b)
    first = policy.peek(0.0, NO_KNEE)
    assert first is not None
    policy.hold_tenant(first.tenant_id, until=10.0)
    other = policy.peek(5.0, NO_KNEE)
    assert other is not None and other.tenant_id != first.tenant_id
    policy.hold_tenant(other.tenant_id, until=10.0)
    assert policy.peek(5.0, NO_KNEE) is None
    assert policy.peek(10.0, NO_KNEE) == first  # the hold ran out
    policy.hold_tenant(first.tenant_id, until=20.0)
    policy.unhold_tenant(first.tenant_id)
    assert policy.peek(11.0, NO_KNEE) == first


def test_priority_orders_a_tenants_own_jobs_only(policy: Policy) -> None:
    low = replace(make_job("low", "t1", [make_node(predicted=5)]), priority=-1)
    high = replace(make_job("high", "t1", [make_node(predicted=500)], arrival=1.0), priority=3)
    other = make_job("other", "t2", [make_node(predicted=50)], arrival=2.0)
    plain = [make_job(j.job_id, j.tenant_id, j.nodes, arrival=j.arrival) for j in (low, high)]
    baseline = make_policy(policy.name)
    for job in (*plain, other):
        submit(baseline, job)
    for job in (low, high, other):
        submit(policy, job)
    before, after = dispatch_all(baseline), dispatch_all(policy)
    # t1's turn comes when it came without priorities, and its higher-priority job takes it
    assert before[0] == "low/n" and after[0] == "high/n"
    assert after.index("high/n") < after.index("low/n")


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_requeued_call_is_ready_again_and_runs_once_more(name: str) -> None:
    policy = make_policy(name)
    job = make_job("j", nodes=[make_node("a")])
    policy.add_job(job, 0.0)
    call = make_ready(job, "a")
    policy.add_ready(call, 0.0)
    policy.mark_dispatched(call.call_id, 1.0)
    policy.on_progress(call.call_id, 3, 2.0)
    policy.requeue(call.call_id, 3.0)
    policy.check_invariants()  # type: ignore[attr-defined]
    assert policy.peek(3.0, NO_KNEE) == call
    policy.mark_dispatched(call.call_id, 4.0)
    policy.on_finished(call.call_id, call.prompt_tokens, 5, 5.0)
    policy.check_invariants()  # type: ignore[attr-defined]
    with pytest.raises(CallNotRunning):
        policy.requeue(call.call_id, 6.0)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_shedding_hides_sheddable_jobs_until_it_stops(name: str) -> None:
    policy = make_policy(name)
    shed = make_job("shed", "t1", nodes=[make_node("a", predicted=1.0)], priority=-1)
    kept = make_job("kept", "t2", nodes=[make_node("a", predicted=500.0)], arrival=1.0)
    for job in (shed, kept):
        policy.add_job(job, job.arrival)
        policy.add_ready(make_ready(job, "a"), job.arrival)
    policy.set_shedding(True)
    assert policy.peek(2.0, NO_KNEE) == make_ready(kept, "a")
    policy.mark_dispatched("kept/a", 2.0)
    assert policy.peek(2.0, NO_KNEE) is None  # only sheddable work is left: it waits
    policy.set_shedding(False)
    assert policy.peek(3.0, NO_KNEE) == make_ready(shed, "a")
    policy.check_invariants()  # type: ignore[attr-defined]
