import random

import pytest

from tenants.policies import EngineLoad, FcfsPolicy, JobInfo, Policy, VtcPolicy
from tests.tenants.policies.factories import dispatch_all, make_job, make_node, submit

W_P, W_Q = 1.0, 2.0


def one_call_job(
    job_id: str,
    tenant: str,
    *,
    prompt: int = 100,
    output: int = 10,
    weight: float = 1.0,
    arrival: float = 0.0,
) -> JobInfo:
    node = make_node("n", prompt=prompt, predicted=output, true=output)
    return make_job(job_id, tenant, [node], weight=weight, arrival=arrival)


def test_charges_prompt_at_dispatch_and_output_as_generated_divided_by_weight() -> None:
    policy = VtcPolicy()
    submit(policy, one_call_job("j", "a", prompt=100, weight=2.0))
    policy.mark_dispatched("j/n", 0.0)
    assert policy.counter("a") == pytest.approx(W_P * 100 / 2)
    policy.on_progress("j/n", 10, 1.0)
    assert policy.counter("a") == pytest.approx((W_P * 100 + W_Q * 10) / 2)
    policy.on_finished("j/n", 100, 15, 2.0)
    assert policy.counter("a") == pytest.approx((W_P * 100 + W_Q * 15) / 2)


def test_the_tenant_with_the_lowest_counter_goes_next() -> None:
    policy = VtcPolicy()
    submit(policy, one_call_job("a1", "a"))
    submit(policy, one_call_job("a2", "a"))
    submit(policy, one_call_job("b1", "b", arrival=1.0), now=1.0)
    assert dispatch_all(policy, 1.0) == ["a1/n", "b1/n", "a2/n"]


def _serve_alone(policy: VtcPolicy, tenant: str, jobs: int) -> None:
    for i in range(jobs):
        submit(policy, one_call_job(f"{tenant}{i}", tenant))
        policy.mark_dispatched(f"{tenant}{i}/n", 0.0)
        policy.on_finished(f"{tenant}{i}/n", 100, 10, 0.0)
        policy.remove_job(f"{tenant}{i}", 0.0)


def test_counter_lift_gives_a_newly_backlogged_tenant_no_credit_for_idle_time() -> None:
    policy = VtcPolicy()
    for i in range(10):
        submit(policy, one_call_job(f"a{i}", "a"))
    policy.mark_dispatched("a0/n", 0.0)
    policy.on_finished("a0/n", 100, 10, 1.0)  # a stays backlogged: a1..a9 wait
    for i in range(10):
        submit(policy, one_call_job(f"b{i}", "b", arrival=2.0), now=2.0)
    assert policy.counter("b") == policy.counter("a") == pytest.approx(120)
    order = [call.split("/")[0][0] for call in dispatch_all(policy, 2.0)[:10]]
    assert order.count("b") == 5, order  # without the lift b would take all ten


def test_lift_never_lowers_a_counter() -> None:
    policy = VtcPolicy()
    _serve_alone(policy, "b", 3)
    submit(policy, one_call_job("a0", "a"))
    submit(policy, one_call_job("b9", "b"))
    assert policy.counter("a") == pytest.approx(360)  # lifted to b's, the last to leave
    submit(policy, one_call_job("a1", "a"))
    policy.mark_dispatched("a0/n", 0.0)
    policy.on_finished("a0/n", 100, 10, 0.0)
    policy.mark_dispatched("a1/n", 0.0)
    policy.on_finished("a1/n", 100, 10, 0.0)
    policy.remove_job("a0", 0.0)
    policy.remove_job("a1", 0.0)
    submit(policy, one_call_job("a2", "a"))  # a rejoins above b's counter: keeps its own
    assert policy.counter("a") == pytest.approx(600)


def test_lift_with_nobody_backlogged_uses_the_last_tenant_to_leave() -> None:
    policy = VtcPolicy()
    _serve_alone(policy, "a", 5)
    submit(policy, one_call_job("b0", "b"))
    assert policy.counter("b") == pytest.approx(policy.counter("a")) == pytest.approx(600)


def _normalized_service_gaps(
    policy: Policy, weights: dict[str, float], seed: int, slots: int = 4
) -> tuple[list[float], float]:
    """Two tenants flood the queue at once; serve with `slots` calls, a token a step each.

    Returns |S_a/w_a - S_b/w_b| after every step while both have calls waiting (S: service in
    w_p * prompt at dispatch + w_q * output as generated) and the bound the proof gives.
    """
    rng = random.Random(seed)
    sizes = {}
    for i in range(150):
        for tenant, weight in weights.items():
            prompt, output = rng.randint(1, 200), rng.randint(1, 30)
            job = one_call_job(
                f"{tenant}{i}",
                tenant,
                prompt=prompt,
                output=output,
                weight=weight,
                arrival=0.001 * (tenant == "b"),
            )
            submit(policy, job)
            sizes[f"{tenant}{i}/n"] = (prompt, output)
    service = dict.fromkeys(weights, 0.0)
    waiting = dict.fromkeys(weights, 150)
    running: dict[str, int] = {}
    gaps = []
    for _ in range(5000):
        while len(running) < slots and (call := policy.peek(0.0, EngineLoad(0, 0, None))):
            policy.mark_dispatched(call.call_id, 0.0)
            running[call.call_id] = 0
            service[call.tenant_id] += W_P * call.prompt_tokens
            waiting[call.tenant_id] -= 1
        for call_id in list(running):
            running[call_id] += 1
            service[call_id[0]] += W_Q
            policy.on_progress(call_id, running[call_id], 0.0)
            if running[call_id] == sizes[call_id][1]:
                policy.on_finished(call_id, sizes[call_id][0], running.pop(call_id), 0.0)
        if min(waiting.values()) == 0:
            break
        gaps.append(abs(service["a"] / weights["a"] - service["b"] / weights["b"]))
    bound = max((W_P * 200 + slots * W_Q * 30) / w for w in weights.values())
    return gaps, bound


@pytest.mark.parametrize("weights", [{"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 1.0}])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_service_gap_of_backlogged_tenants_stays_bounded(
    weights: dict[str, float], seed: int
) -> None:
    gaps, bound = _normalized_service_gaps(VtcPolicy(), weights, seed)
    assert len(gaps) > 500
    assert max(gaps) <= bound


def test_the_gap_harness_catches_an_unfair_order() -> None:
    gaps, bound = _normalized_service_gaps(FcfsPolicy(), {"a": 1.0, "b": 1.0}, seed=1)
    assert max(gaps) > 10 * bound


def test_a_shared_pool_orders_tenants_by_their_service_alone() -> None:
    policy = VtcPolicy()
    submit(policy, make_job("a", "t1"))
    assert policy.by_weight and policy.pool_offsets(["a"], 0.0) == {}
