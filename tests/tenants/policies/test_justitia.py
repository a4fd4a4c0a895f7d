import itertools
import random
from dataclasses import replace

import pytest

from bench.sim.gps import GpsCall, GpsJob, gps_finish_times
from tenants.policies import (
    EngineLoad,
    JobInfo,
    JustitiaPolicy,
    NodeCost,
    kv_token_time,
)
from tests.tenants.policies.factories import (
    NO_KNEE,
    make_job,
    make_node,
    make_ready,
    submit,
)


def random_batch(seed: int) -> list[JobInfo]:
    """Jobs of three tenants arriving together: single calls, chains and fan-out/fan-in."""
    rng = random.Random(seed)
    weights = {"a": 1.0, "b": 2.0, "c": 0.5}
    jobs = []
    for i in range(12):
        tenant = rng.choice(sorted(weights))
        nodes: list[NodeCost] = []
        shape = rng.choice(["single", "chain", "fan"])
        width = 1 if shape == "single" else rng.randint(2, 4)
        for k in range(width):
            parents = [f"n{k - 1}"] if shape == "chain" and k else []
            nodes.append(
                make_node(
                    f"n{k}", parents, prompt=rng.randint(100, 400), predicted=rng.randint(5, 60)
                )
            )
        if shape == "fan":
            nodes.append(
                make_node(
                    "join",
                    [n.node_id for n in nodes],
                    prompt=rng.randint(100, 400),
                    predicted=rng.randint(5, 60),
                )
            )
        jobs.append(make_job(f"j{i}", tenant, nodes, weight=weights[tenant]))
    return jobs


def as_gps_job(job: JobInfo) -> GpsJob:
    calls = tuple(
        GpsCall(n.node_id, n.parents, n.prompt_tokens, int(n.predicted_output)) for n in job.nodes
    )
    return GpsJob(job.job_id, job.tenant_id, job.weight, job.arrival, calls)


CAPACITY = 50.0  # KV token-time a second: below every call's footprint, so each job could use
# more than its fair share and the reference's per-call caps never bind


@pytest.mark.parametrize("seed", range(8))
def test_the_tags_of_a_batch_order_it_as_the_gps_reference_finishes_it(seed: int) -> None:
    jobs = random_batch(seed)
    finish = gps_finish_times([as_gps_job(job) for job in jobs], capacity=CAPACITY)
    by_finish = sorted(finish, key=finish.__getitem__)
    gaps = [finish[b] - finish[a] for a, b in itertools.pairwise(by_finish)]
    assert min(gaps) > 1e-6  # a strict order to compare against
    policy = JustitiaPolicy()
    for job in jobs:
        submit(policy, job)
    assert sorted(finish, key=policy.tag) == by_finish


@pytest.mark.parametrize("seed", range(8))
def test_a_batch_served_a_call_at_a_time_finishes_every_job_by_its_gps_finish(seed: int) -> None:
    jobs = {job.job_id: job for job in random_batch(seed)}
    finish = gps_finish_times([as_gps_job(job) for job in jobs.values()], capacity=CAPACITY)
    policy = JustitiaPolicy()
    for job in jobs.values():
        submit(policy, job)
    done: dict[str, set[str]] = {job_id: set() for job_id in jobs}
    now = 0.0
    while (call := policy.peek(now, NO_KNEE)) is not None:
        policy.mark_dispatched(call.call_id, now)
        job = jobs[call.job_id]
        node = next(n for n in job.nodes if n.node_id == call.node_id)
        output = round(node.predicted_output)
        now += kv_token_time(node.prompt_tokens, output) / CAPACITY
        policy.on_finished(call.call_id, node.prompt_tokens, output, now)
        done[job.job_id].add(node.node_id)
        if len(done[job.job_id]) == len(job.nodes):
            policy.remove_job(job.job_id, now)
            assert now <= finish[job.job_id] * (1 + 1e-9), job.job_id
            continue
        for child in job.nodes:
            if node.node_id in child.parents and set(child.parents) <= done[job.job_id]:
                policy.add_ready(make_ready(job, child.node_id), now)
    assert all(len(done[j]) == len(job.nodes) for j, job in jobs.items())


def overrun_setup() -> JustitiaPolicy:
    policy = JustitiaPolicy()
    short = [make_node("a1", predicted=10), make_node("a2", predicted=10)]
    submit(policy, make_job("liar", "t1", short))
    submit(policy, make_job("honest", "t2", [make_node("b", predicted=40)]))
    return policy


def test_a_call_running_past_its_prediction_moves_its_job_back_at_once() -> None:
    policy = overrun_setup()
    assert policy.tag("liar") < policy.tag("honest")
    policy.mark_dispatched("liar/a1", 0.0)
    peeked = policy.peek(0.0, NO_KNEE)
    assert peeked is not None and peeked.call_id == "liar/a2"
    before = policy.tag("liar")
    policy.on_progress("liar/a1", 40, 1.0)  # four times its prediction, still running
    assert policy.tag("liar") > before
    assert policy.tag("liar") > policy.tag("honest")
    peeked = policy.peek(1.0, NO_KNEE)
    assert peeked is not None and peeked.call_id == "honest/b"
    assert policy.priority("liar/a1") > policy.priority("honest/b")  # preempt the liar first


def test_tag_follows_the_true_cost_at_finish() -> None:
    policy = overrun_setup()
    policy.mark_dispatched("honest/b", 0.0)
    before = policy.tag("honest")
    policy.on_finished("honest/b", 100, 5, 1.0)  # far shorter than the 40 predicted
    assert policy.tag("honest") < before


def test_overrun_tag_matches_the_fair_share_arithmetic() -> None:
    policy = overrun_setup()
    policy.mark_dispatched("liar/a1", 0.0)
    policy.on_progress("liar/a1", 40, 1.0)
    # Alone in their tenants since V = 0, each job's tag is its whole cost over weight 1.
    assert policy.tag("liar") == pytest.approx(kv_token_time(100, 40) + kv_token_time(100, 10))
    assert policy.tag("honest") == pytest.approx(kv_token_time(100, 40))


def test_a_refined_prediction_re_keys_the_running_job() -> None:
    policy = overrun_setup()
    policy.mark_dispatched("honest/b", 0.0)
    policy.on_refined("honest/b", 5.0, 0.5)  # prefilled: it looks short after all
    assert policy.tag("honest") == pytest.approx(kv_token_time(100, 5))
    assert policy.tag("honest") < policy.tag("liar")
    policy.on_refined("honest/b", 4000.0, 0.6)  # past its max_tokens: charged the cap
    assert policy.tag("honest") == pytest.approx(kv_token_time(100, 1024))
    policy.check_invariants()


def test_a_ready_call_predicted_again_re_keys_its_job_before_it_runs() -> None:
    """Its kind of call found to mispredict, the liar's call still waiting is predicted again:
    its job loses the head start its first prediction gave it, the honest job keeps its tag."""
    policy = overrun_setup()
    honest = policy.tag("honest")
    assert policy.tag("liar") < honest
    policy.on_refined("liar/a2", 40.0, 0.5)
    assert policy.tag("liar") == pytest.approx(kv_token_time(100, 10) + kv_token_time(100, 40))
    assert policy.tag("honest") == honest
    peeked = policy.peek(0.5, NO_KNEE)
    assert peeked is not None and peeked.call_id == "honest/b"
    policy.check_invariants()


def test_a_refined_prediction_never_goes_below_what_the_call_produced() -> None:
    policy = overrun_setup()
    policy.mark_dispatched("honest/b", 0.0)
    policy.on_progress("honest/b", 30, 1.0)
    policy.on_refined("honest/b", 10.0, 1.0)
    assert policy.tag("honest") == pytest.approx(kv_token_time(100, 30))
    policy.on_finished("honest/b", 100, 30, 2.0)
    policy.check_invariants()


def knee_setup(policy: JustitiaPolicy | None = None) -> JustitiaPolicy:
    """Three jobs by tag: small (two calls), mid, big (the longest); one job pampered unless
    `policy` says otherwise."""
    policy = policy or JustitiaPolicy(pampered_jobs=1)
    submit(policy, make_job("small", "t1", [make_node("x", predicted=5), make_node("y")]))
    submit(policy, make_job("mid", "t2", [make_node("z", predicted=100)]))
    submit(policy, make_job("big", "t3", [make_node("w", predicted=400)]))
    return policy


def test_past_the_knee_only_the_pampered_and_the_longest_job_are_admitted() -> None:
    policy = knee_setup()
    at_knee = EngineLoad(running_calls=4, batch_tokens=0, knee_calls=4)
    # one running call: the backlog drains no faster than any job's path, so no job is a chain
    below = EngineLoad(running_calls=1, batch_tokens=0, knee_calls=4)
    # the pampered job runs everything it has, then the longest job (big, 400 tokens), by tag
    assert dispatch_all_at(policy, at_knee) == ["small/x", "small/y", "big/w"]
    peeked = policy.peek(0.0, below)
    assert peeked is not None and peeked.call_id == "mid/z"


def test_past_the_knee_with_no_active_job_nothing_is_admitted() -> None:
    # calls of a removed job may still hold the engine past the knee
    policy = JustitiaPolicy()
    assert policy.peek(0.0, EngineLoad(running_calls=5, batch_tokens=0, knee_calls=4)) is None


def test_more_pampered_jobs_admit_further_past_the_knee() -> None:
    policy = knee_setup(JustitiaPolicy(pampered_jobs=2))
    at_knee = EngineLoad(running_calls=9, batch_tokens=0, knee_calls=4)
    assert dispatch_all_at(policy, at_knee) == ["small/x", "small/y", "mid/z", "big/w"]


@pytest.mark.parametrize(("knee", "admitted"), [(1, []), (2, ["mid/z"])])
def test_by_default_as_many_jobs_as_the_knee_has_calls_are_pampered(
    knee: int, admitted: list[str]
) -> None:
    policy = knee_setup(JustitiaPolicy())
    at_knee = EngineLoad(running_calls=knee, batch_tokens=0, knee_calls=knee)
    assert dispatch_all_at(policy, at_knee) == ["small/x", "small/y", *admitted, "big/w"]


def test_past_the_knee_the_longest_remaining_path_is_admitted_not_the_largest_job() -> None:
    policy = JustitiaPolicy(pampered_jobs=1)
    submit(policy, make_job("small", "t1", [make_node("n", predicted=5)]))
    wide = [make_node(f"w{k}", predicted=150) for k in range(4)]  # 600 tokens, path 150
    submit(policy, make_job("wide", "t2", wide))
    chain = [make_node(f"c{k}", [f"c{k - 1}"] if k else [], predicted=60) for k in range(3)]
    long = make_job("long", "t3", chain)  # 180 tokens, all on its path
    submit(policy, long)
    at_knee = EngineLoad(running_calls=4, batch_tokens=0, knee_calls=4)
    assert dispatch_all_at(policy, at_knee) == ["small/n", "long/c0"]
    policy.on_finished("long/c0", 100, 60, 0.0)
    policy.add_ready(make_ready(long, "c1"), 0.0)  # its path is down to 120: wide is longest
    assert dispatch_all_at(policy, at_knee) == [f"wide/w{k}" for k in range(4)]
    policy.check_invariants()


def dispatch_all_at(policy: JustitiaPolicy, load: EngineLoad) -> list[str]:
    order = []
    while (call := policy.peek(0.0, load)) is not None:
        policy.mark_dispatched(call.call_id, 0.0)
        order.append(call.call_id)
    return order


def test_a_stream_of_small_jobs_cannot_starve_a_big_one() -> None:
    policy = JustitiaPolicy()
    big = make_job("big", "heavy", [make_node("n", prompt=100, predicted=200)])
    submit(policy, big)
    small_cost = kv_token_time(100, 20)
    ahead = 0
    for i in range(200):
        small = make_job(f"s{i}", "light", [make_node("n", prompt=100, predicted=20)])
        submit(policy, small)
        call = policy.peek(float(i), NO_KNEE)
        assert call is not None
        if call.job_id == "big":
            break
        ahead += 1
        policy.mark_dispatched(call.call_id, float(i))
        policy.on_finished(call.call_id, 100, 20, float(i))
        policy.remove_job(call.job_id, float(i))
    else:
        pytest.fail("the big job was starved")
    # As under GPS: the big job finishes once the light tenant, at an equal share, has had as
    # much service as the big job needs.
    assert abs(ahead - kv_token_time(100, 200) / small_cost) <= 1


CHAIN = make_job(
    "chain",
    "heavy",
    [make_node(f"c{k}", [f"c{k - 1}"] if k else [], predicted=50) for k in range(4)],
)


def chain_setup() -> JustitiaPolicy:
    """Six one-call jobs of 20 tokens and a chain of four 50-token calls (the latest tag)."""
    policy = JustitiaPolicy()
    for i in range(6):
        submit(policy, make_job(f"s{i}", f"t{i}", [make_node("n", predicted=20)]))
    submit(policy, CHAIN)
    assert max(policy.tag(f"s{i}") for i in range(6)) < policy.tag("chain")
    return policy


def test_a_chain_that_outlasts_the_backlog_goes_first() -> None:
    policy = chain_setup()
    # 8 calls a step drain the 320 remaining tokens in 40 steps; the chain needs 200 > 1.5 x 40
    wide = EngineLoad(running_calls=8, batch_tokens=0, knee_calls=None)
    peeked = policy.peek(0.0, wide)
    assert peeked is not None and peeked.call_id == "chain/c0"
    policy.mark_dispatched("chain/c0", 0.0)
    peeked = policy.peek(0.0, wide)  # the chain has no other ready call: back to the tag order
    assert peeked is not None and peeked.call_id == "s0/n"


def test_a_long_job_of_two_calls_on_its_path_waits_for_its_tag() -> None:
    policy = JustitiaPolicy()
    for i in range(6):
        submit(policy, make_job(f"s{i}", f"t{i}", [make_node("n", predicted=20)]))
    pair = [make_node(f"p{k}", [f"p{k - 1}"] if k else [], predicted=150) for k in range(2)]
    submit(policy, make_job("pair", "heavy", pair))
    # 8 calls a step drain the 420 remaining tokens in 52.5 steps; its path of 300 is more than
    # 1.5 x that, yet two calls wait for at most two turns: no precedence
    wide = EngineLoad(running_calls=8, batch_tokens=0, knee_calls=None)
    assert dispatch_all_at(policy, wide) == [*(f"s{i}/n" for i in range(6)), "pair/p0"]


def test_a_chain_the_backlog_outlasts_waits_for_its_tag() -> None:
    policy = chain_setup()
    # 2 calls a step need 160 steps for the backlog: 200 is not 1.5 times that
    narrow = EngineLoad(running_calls=2, batch_tokens=0, knee_calls=None)
    assert dispatch_all_at(policy, narrow) == [*(f"s{i}/n" for i in range(6)), "chain/c0"]


def test_a_shared_engine_drains_this_policys_backlog_with_its_own_calls_only() -> None:
    # Replicas share the engine: 8 calls run, 2 of them for these jobs. The backlog held here
    # (320 tokens) drains at 2 calls a step, 160 steps: the chain's 200 is not 1.5 x that, as
    # with an engine of 2 calls (above); counted against all 8 it would seem to go first.
    policy = chain_setup()
    shared = EngineLoad(running_calls=8, batch_tokens=0, knee_calls=None, own_calls=2)
    assert dispatch_all_at(policy, shared) == [*(f"s{i}/n" for i in range(6)), "chain/c0"]


def test_past_the_knee_a_chain_gets_no_precedence() -> None:
    policy = chain_setup()
    at_knee = EngineLoad(running_calls=8, batch_tokens=0, knee_calls=4)
    peeked = policy.peek(0.0, at_knee)
    assert peeked is not None and peeked.call_id == "s0/n"


def test_finished_calls_shorten_the_chains_remaining_path() -> None:
    policy = chain_setup()
    four = EngineLoad(running_calls=4, batch_tokens=0, knee_calls=None)
    peeked = policy.peek(0.0, four)  # 200 tokens against 320 / 4 = 80 steps of backlog
    assert peeked is not None and peeked.call_id == "chain/c0"
    for k in range(3):
        policy.mark_dispatched(f"chain/c{k}", 0.0)
        policy.on_finished(f"chain/c{k}", 100, 50, 0.0)
        policy.add_ready(make_ready(CHAIN, f"c{k + 1}"), 0.0)
    peeked = policy.peek(0.0, four)  # 50 left against 170 / 4 = 42.5 steps: not past 1.5 x
    assert peeked is not None and peeked.call_id == "s0/n"
    policy.check_invariants()


def test_a_refined_prediction_can_make_a_job_a_chain() -> None:
    policy = JustitiaPolicy()
    for i in range(6):
        submit(policy, make_job(f"s{i}", f"t{i}", [make_node("n", predicted=20)]))
    chain = [make_node(f"c{k}", [f"c{k - 1}"] if k else [], predicted=20) for k in range(3)]
    submit(policy, make_job("mix", "heavy", [make_node("r", predicted=20), *chain]))
    four = EngineLoad(running_calls=4, batch_tokens=0, knee_calls=None)
    peeked = policy.peek(0.0, four)  # path 60 against 200 / 4 = 50 steps of backlog
    assert peeked is not None and peeked.call_id == "s0/n"
    policy.mark_dispatched("mix/c0", 0.0)
    policy.on_refined("mix/c0", 500.0, 0.0)  # path 540 against 680 / 4 = 170 steps
    peeked = policy.peek(0.0, four)
    assert peeked is not None and peeked.call_id == "mix/r"
    policy.check_invariants()


def test_a_single_long_call_that_outlasts_the_backlog_waits_for_its_tag() -> None:
    policy = knee_setup()  # small (5 + 50 in parallel), mid 100, big 400: 555 tokens in all
    three = EngineLoad(running_calls=3, batch_tokens=0, knee_calls=None)
    # big's 400 > 1.5 x 555 / 3, but one call waits one turn at most
    assert dispatch_all_at(policy, three) == ["small/x", "small/y", "mid/z", "big/w"]
    policy.check_invariants()


def test_jobs_leave_the_remaining_paths_whether_or_not_they_were_measured() -> None:
    policy = chain_setup()
    policy.peek(0.0, EngineLoad(running_calls=8, batch_tokens=0, knee_calls=None))
    submit(policy, make_job("late", "t9", [make_node("n", predicted=30)]))
    policy.remove_job("late", 0.0)  # never measured
    policy.remove_job("s0", 0.0)  # measured at the peek
    policy.check_invariants()
    peeked = policy.peek(0.0, EngineLoad(running_calls=8, batch_tokens=0, knee_calls=None))
    assert peeked is not None and peeked.call_id == "chain/c0"
    policy.check_invariants()


def test_a_job_s_offset_is_its_cost_not_yet_dispatched_per_unit_of_weight() -> None:
    policy = JustitiaPolicy()
    two = make_job("two", "t1", [make_node("a", predicted=10), make_node("b", predicted=10)])
    submit(policy, two)
    submit(policy, make_job("one", "t1", [make_node("c", predicted=30)]))
    submit(policy, make_job("heavy", "t2", [make_node("d", predicted=40)], weight=2.0))
    call, heavy = kv_token_time(100, 10), kv_token_time(100, 40) / 2.0
    big = kv_token_time(100, 30)
    jobs = ("two", "one", "heavy")
    assert policy.by_weight  # a shared pool charges its tenants' service by weight
    assert policy.pool_offsets(["one"], 0.0) == pytest.approx({"one": big})  # only those asked for
    offsets = policy.pool_offsets(jobs, 0.0)
    assert offsets == pytest.approx({"two": 2 * call, "one": big, "heavy": heavy})
    policy.mark_dispatched("two/a", 0.0)  # dispatched: in its tenant's service, not its offset
    offsets = policy.pool_offsets(jobs, 0.0)
    assert offsets == pytest.approx({"two": call, "one": big, "heavy": heavy})
    policy.on_finished("two/a", 100, 10, 1.0)
    policy.mark_dispatched("two/b", 1.0)
    assert policy.pool_offsets(jobs, 0.0) == pytest.approx({"one": big, "heavy": heavy})


def test_a_tenant_with_many_short_jobs_yields_once_it_leads_gps_by_more_than_a_call() -> None:
    policy = JustitiaPolicy()
    for i in range(20):
        submit(policy, make_job(f"a{i}", "many", [make_node("n", prompt=100, predicted=20)]))
    for i in range(3):
        submit(policy, make_job(f"b{i}", "few", [make_node("n", prompt=100, predicted=120)]))
    assert max(policy.tag(f"a{i}") for i in range(20)) < min(policy.tag(f"b{i}") for i in range(3))
    order = []
    for now in range(12):
        call = policy.peek(float(now), NO_KNEE)
        assert call is not None
        order.append(call.tenant_id)
        policy.mark_dispatched(call.call_id, float(now))
        policy.on_finished(call.call_id, 100, 20 if call.tenant_id == "many" else 120, float(now))
        policy.remove_job(call.job_id, float(now))
        policy.check_invariants()
    # Equal weights: serving k of the short jobs puts the tenant k * 2210 / 2 ahead of GPS in
    # virtual time; it yields once that passes the virtual time of one of the long calls
    # (19,260 / 2), i.e. after 9 jobs, though by tags all 20 go first.
    assert kv_token_time(100, 20) == 2210 and kv_token_time(100, 120) == 19260
    assert order[:10] == ["many"] * 9 + ["few"]
    assert order[10:] == ["many", "many"]


def test_a_promoted_chain_cannot_lend_its_precedence_to_its_tenants_other_jobs() -> None:
    """Priority orders a tenant's own jobs, but a chain's precedence is the chain's: a tenant
    that keeps a chain promoted and submits its other jobs at a higher priority must not have
    them all go first (the chain would never run and keep winning its tenant every turn)."""
    policy = chain_setup()
    for i in range(6):
        job = replace(make_job(f"h{i}", "heavy", [make_node("n", predicted=20)]), priority=1)
        submit(policy, job)
    wide = EngineLoad(running_calls=8, batch_tokens=0, knee_calls=None)
    peeked = policy.peek(0.0, wide)
    assert peeked is not None and peeked.call_id == "chain/c0"  # the chain spends its turn
