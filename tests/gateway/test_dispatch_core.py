"""The dispatch core alone: decisions from `now` and capacity snapshots, no I/O, no clock."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gateway.backends import BackendCapacity
from gateway.core_call import CoreCall, Knee
from gateway.dispatch_core import MAX_ATTEMPTS, PROGRESS_REKEY_S, DispatchCore
from tenants.policies import JobInfo, NodeCost, ReadyCall, kv_token_time, make_policy
from tests.gateway.factories import room


def make_core(
    policy: str = "fcfs", knee_calls: Knee = None, share_slots: bool = False
) -> DispatchCore[str]:
    return DispatchCore(make_policy(policy), knee_calls, share_slots=share_slots)


def add_job(
    core: DispatchCore[str],
    job_id: str,
    nodes: int = 1,
    now: float = 0.0,
    tenant: str = "t",
    prompt: int = 16,
    predicted: float = 16.0,
    priority: int = 0,
) -> list[ReadyCall]:
    costs = tuple(NodeCost(f"n{i}", (), prompt, predicted, 64) for i in range(nodes))
    core.add_job(JobInfo(job_id, tenant, 1.0, now, costs, priority=priority), now)
    calls = [
        ReadyCall(f"{job_id}/n{i}", job_id, tenant, f"n{i}", prompt, predicted, 64)
        for i in range(nodes)
    ]
    for call in calls:
        core.add_ready(call, 16, call.call_id, now, sheddable=priority < 0)
    return calls


def test_a_call_goes_to_a_backend_with_room_and_waits_while_none_has_any() -> None:
    core = make_core()
    add_job(core, "a")
    assert core.next(0.0, {"x": room(free_blocks=1)}) is None  # prompt 16 + 16 needs 2 blocks
    assert core.blocked
    dispatch = core.next(1.0, {"x": room(free_blocks=1), "y": room(free_blocks=2)})
    assert dispatch is not None and dispatch.entry.backend == "y" and dispatch.needs_reserve
    assert not core.blocked and list(core.taking) == ["a/n0"]


def test_calls_being_taken_hold_their_room_until_launched() -> None:
    core = make_core()
    add_job(core, "a", nodes=3)
    snapshot = {"x": room(free_blocks=4)}  # room for two calls of 2 blocks each
    first, second = core.next(0.0, snapshot), core.next(0.0, snapshot)
    assert first is not None and second is not None
    assert core.next(0.0, snapshot) is None  # the same snapshot promises no block twice
    assert core.launched("a/n0", 1.0) is not None
    # once launched, the backend's own snapshot counts the call: the promise is gone
    assert core.load({"x": room(running=1)}).running_calls == 2  # one running, one taking


def test_a_reserved_call_is_dispatched_at_once() -> None:
    core = make_core()
    core.add_job(JobInfo("a", "t", 1.0, 0.0, (NodeCost("n", (), 4, 4.0, 8),)), 0.0)
    core.add_ready(ReadyCall("a/n", "a", "t", "n", 4, 4.0, 8), 4, "payload", 0.0, reserved=True)
    dispatch = core.next(0.0, {"x": room()})
    assert dispatch is not None and not dispatch.needs_reserve
    assert dispatch.entry.payload == "payload" and list(core.running) == ["a/n"]
    assert dispatch.entry.attempts == 1


def test_a_quota_refusal_holds_the_tenant_until_its_retry_time() -> None:
    core = make_core()
    add_job(core, "a", tenant="slow")
    add_job(core, "b", now=1.0, tenant="fast")
    snapshot = {"x": room()}
    taken = core.next(2.0, snapshot)
    assert taken is not None and taken.entry.call.job_id == "a"
    core.retry_later("a/n0", until=10.0)
    nxt = core.next(3.0, snapshot)
    assert nxt is not None and nxt.entry.call.job_id == "b"  # the other tenant goes on
    assert core.next(4.0, snapshot) is None  # still held
    again = core.next(10.0, snapshot)
    assert again is not None and again.entry.call.call_id == "a/n0"


def test_a_call_waits_for_the_gateway_only_once_its_tenant_s_quota_releases_it() -> None:
    core = make_core()
    add_job(core, "a", nodes=3, tenant="t")
    add_job(core, "b", tenant="other")
    snapshot = {"x": room()}
    first = core.next(0.0, snapshot)
    assert first is not None and core.launched("a/n0", 0.0) is not None
    assert core.next(1.0, snapshot) is not None
    core.retry_later("a/n1", until=30.0)  # say, its concurrency limit
    held, other = core.ready["a/n1"], core.ready["b/n0"]
    assert core.book.quota_holds("t", 2.0) and core.book.waiting_since(held, 0.0) == 30.0
    core.finished("a/n0", 16, 16, 5.0)  # a slot of its own comes free: released early
    assert not core.book.quota_holds("t", 5.0)
    assert core.book.waiting_since(held, 0.0) == 5.0  # ready before: waits from the release
    assert core.book.waiting_since(held, 7.0) == 7.0  # ready after: from ready
    assert core.book.waiting_since(other, 0.0) == 0.0


def test_a_refusal_of_one_call_does_not_move_the_wait_of_its_tenant_s_calls_sent_before() -> None:
    """A tenant at its concurrency limit has a call refused every second while its call sent
    at 0.1 s waits for its first token: every call of the tenant read the tenant's newest hold,
    the sent one's wait began at each hold's end (never judged overdue; at its first token a
    TTFT from the last hold's end, or negative while a hold was still in force)."""
    core = make_core()
    add_job(core, "a", nodes=2, tenant="t")
    snapshot = {"x": room()}
    sent = core.next(0.1, snapshot)
    assert sent is not None and core.launched(sent.entry.call.call_id, 0.1) is not None
    for t in (1.0, 2.0, 3.0):
        taken = core.next(t, snapshot)
        assert taken is not None and taken.entry is not sent.entry
        core.retry_later(taken.entry.call.call_id, until=t + 1.0)
        assert core.book.waiting_since(sent.entry, 0.0) == 0.0
    refused = core.ready[taken.entry.call.call_id]
    assert core.book.waiting_since(refused, 0.0) == 4.0  # still ready: held till 4
    again = core.next(4.0, snapshot)  # released: sent, its wait fixed from the release
    assert again is not None and again.entry is refused
    core.book.quota_until["t"] = 9.0  # another refusal of the tenant's
    assert core.book.waiting_since(refused, 0.0) == 4.0


def test_a_dropped_call_leaves_the_policy_unserved() -> None:
    core = make_core()
    add_job(core, "a", nodes=2)
    assert core.next(0.0, {"x": room()}) is not None
    assert core.drop("a/n0", 1.0) is not None
    assert core.drop("a/n1", 1.0) is not None
    assert not core.ready and not core.taking and core.next(2.0, {"x": room()}) is None
    assert core.remove_job("a", 2.0) == []


def test_the_knee_counts_every_serving_backend() -> None:
    core = make_core("justitia", knee_calls=2)
    healthy = {"x": room(running=1), "y": room(running=1)}
    assert core.load(healthy).knee_calls == 4 and core.load(healthy).running_calls == 2
    one_down = {"x": room(running=1), "y": room(running=1, healthy=False)}
    assert core.load(one_down).knee_calls == 2


def test_an_auto_knee_is_the_serving_backends_own_once_each_has_measured_one() -> None:
    core = make_core("justitia", knee_calls="auto")
    x, y = room(running=1), room(running=1)
    measured = {"x": replace(x, knee_calls=20), "y": replace(y, knee_calls=30)}
    assert core.load(measured).knee_calls == 50
    assert core.load({"x": measured["x"], "y": y}).knee_calls is None  # y has not measured yet
    y_down = replace(y, healthy=False)
    assert core.load({"x": measured["x"], "y": y_down}).knee_calls == 20
    assert core.load({"y": y_down}).knee_calls is None
    assert make_core("justitia", knee_calls=8).load(measured).knee_calls == 16  # the operator's


def test_progress_past_the_prediction_reprioritizes_the_jobs_running_calls() -> None:
    core = make_core("justitia")
    add_job(core, "a", nodes=2, predicted=4.0)
    add_job(core, "b", now=0.5, predicted=40.0)
    snapshot = {"x": room()}
    for _ in range(3):
        dispatch = core.next(1.0, snapshot)
        assert dispatch is not None
        core.launched(dispatch.entry.call.call_id, 1.0)
    before = core.running["a/n1"].priority
    assert core.progress("a/n0", 3, 2.0) == []  # within its prediction: no re-key
    changes = core.progress("a/n0", 200, 3.0)  # far past it: the excess is charged now
    assert [c.entry.call.call_id for c in changes] == ["a/n0", "a/n1"]
    assert core.running["a/n1"].priority == changes[1].priority != before
    # its running calls follow the charges at most every PROGRESS_REKEY_S, whichever call
    # made them: each token of each call re-keyed every call of its job
    assert core.progress("a/n1", 300, 3.0 + PROGRESS_REKEY_S / 2) == []
    assert core.progress("a/n0", 201, 3.0 + PROGRESS_REKEY_S / 2) == []
    later = core.progress("a/n0", 202, 3.0 + PROGRESS_REKEY_S)
    assert [c.entry.call.call_id for c in later] == ["a/n0", "a/n1"]
    assert later[0].priority > changes[0].priority  # every token since was charged


def test_a_tenant_s_ready_calls_planned_again_re_key_their_jobs() -> None:
    core = make_core("justitia")
    add_job(core, "a", nodes=3, predicted=4.0)
    add_job(core, "h", now=0.5, tenant="h", predicted=40.0)
    snapshot = {"x": room()}
    dispatch = core.next(1.0, snapshot)
    assert dispatch is not None and dispatch.entry.call.call_id == "a/n0"
    core.launched("a/n0", 1.0)
    before = core.running["a/n0"].priority
    shown = core.policy.peek(1.0, core.load(snapshot))
    assert shown is not None and shown.call_id == "a/n1"
    asked = []

    def widened(entry: CoreCall[str]) -> tuple[ReadyCall, int]:
        asked.append(entry.call.call_id)
        return replace(entry.call, predicted_output=48.0), 48

    changes = core.replan("t", widened, 2.0)
    assert asked == ["a/n1", "a/n2"]  # its ready calls: neither its running one nor h's
    entry = core.ready["a/n1"]
    assert (entry.call.predicted_output, entry.reserve_output) == (48.0, 48)
    assert [(c.entry.call.call_id, c.priority) for c in changes] == [
        ("a/n0", core.running["a/n0"].priority)
    ]
    assert core.running["a/n0"].priority != before
    dispatch = core.next(2.0, snapshot)
    assert dispatch is not None and dispatch.entry.call.call_id == "h/n0"


def test_a_lost_call_runs_again_once_on_another_backend_then_fails() -> None:
    core = make_core()
    add_job(core, "a")
    snapshot = {"x": room(), "y": room()}
    backends = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        dispatch = core.next(float(attempt), snapshot)
        assert dispatch is not None and dispatch.needs_reserve  # its quota is taken again
        backends.append(dispatch.entry.backend)
        entry = core.launched("a/n0", float(attempt))
        assert entry is not None and entry.attempts == attempt
        if attempt < MAX_ATTEMPTS:
            assert core.lost("a/n0", float(attempt)) is entry
            assert list(core.ready) == ["a/n0"] and not core.running
    assert core.lost("a/n0", 9.0) is None  # lost twice: the caller fails it
    assert core.finished("a/n0", 16, 0, 9.0) == []
    assert not core.running and backends[0] != backends[1]


def test_in_a_pool_of_one_a_lost_call_runs_again_on_the_same_backend() -> None:
    core = make_core()
    add_job(core, "a")
    assert core.next(0.0, {"x": room()}) is not None and core.launched("a/n0", 0.0)
    assert core.lost("a/n0", 1.0) is not None
    dispatch = core.next(2.0, {"x": room()})
    assert dispatch is not None and dispatch.entry.backend == "x"


def test_a_lost_call_runs_again_on_the_same_backend_while_the_others_are_down() -> None:
    # kept off x while y is down, it would wait for y, and hold the pool's order back with it
    core = make_core()
    add_job(core, "a")
    assert core.next(0.0, {"x": room(), "y": room()}) is not None and core.launched("a/n0", 0.0)
    assert core.lost("a/n0", 1.0) is not None
    dispatch = core.next(2.0, {"x": room(), "y": room(healthy=False)})
    assert dispatch is not None and dispatch.entry.backend == "x"


def test_a_held_job_shows_no_call_until_it_is_let_go_and_others_go_on() -> None:
    """A fenced job (its replica's lease on it may have lapsed): the call it set aside unsent
    waits unshown and unpublished, without an attempt spent, while other jobs go on."""
    core = make_core()
    add_job(core, "a", tenant="t1")
    snapshot = {"x": room()}
    dispatch = core.next(0.0, snapshot)
    assert dispatch is not None and core.launched("a/n0", 0.0) is not None
    assert core.yielded("a/n0", 1.0) is not None  # set aside before it was sent
    core.hold_job("a")
    add_job(core, "b", now=2.0, tenant="t2")
    assert core.heads(2.0) == (("t1", "t2"), {"t2": 2.0})  # t1 could send nothing
    nxt = core.next(2.0, snapshot)
    assert nxt is not None and nxt.entry.call.job_id == "b"  # another job goes on
    assert core.next(3.0, snapshot) is None
    core.unhold_job("a")
    again = core.next(4.0, snapshot)
    assert again is not None and again.entry.call.call_id == "a/n0"
    entry = core.launched("a/n0", 4.0)
    assert entry is not None and entry.attempts - entry.yields == 1
    core.hold_job("a")
    core.finished("a/n0", 16, 16, 5.0)
    assert core.remove_job("a", 5.0) == [] and core.heads(5.0) == (("t2",), {})
    core.policy.check_invariants()  # type: ignore[attr-defined]


def test_a_removed_job_forgets_its_waiting_calls_and_its_running_calls_end_alone() -> None:
    core = make_core()
    add_job(core, "a", nodes=3)
    snapshot = {"x": room()}
    first = core.next(0.0, snapshot)
    second = core.next(0.0, snapshot)
    assert first is not None and second is not None
    core.launched(first.entry.call.call_id, 0.0)
    gone = core.remove_job("a", 1.0)
    assert sorted(e.call.call_id for e in gone) == ["a/n1", "a/n2"]  # taking and ready
    assert core.launched(second.entry.call.call_id, 1.0) is None  # its job ended: release it
    assert core.progress("a/n0", 5, 2.0) == [] and core.finished("a/n0", 16, 5, 2.0) == []


def test_a_one_call_job_starts_at_once_only_with_room_beside_every_ready_call() -> None:
    core = make_core()
    add_job(core, "a")  # ready, 2 blocks
    call = ReadyCall("b/n", "b", "t", "n", 16, 16.0, 64)
    assert core.starts_at_once(call, 16, {"x": room(free_blocks=4)})
    assert not core.starts_at_once(call, 16, {"x": room(free_blocks=3)})
    assert not core.starts_at_once(call, 16, {"x": room(free_slots=1)})
    assert core.starts_at_once(call, 16, {"x": room(free_blocks=3), "y": room(free_blocks=4)})


def test_a_sheddable_one_call_job_does_not_start_at_once_within_the_reserve() -> None:
    """Its quota is reserved with its admission when it starts at once; a sheddable call the
    reserve then held back kept that reservation (a concurrent call, its max_tokens of the
    bucket) for as long as the overload level held."""
    core = make_core()
    core.sheddable_reserve = 1 / 8  # level 1: 2 of 16 slots kept from sheddable calls
    call = ReadyCall("b/n", "b", "t", "n", 16, 16.0, 64)
    at_reserve = {"x": room(free_slots=2, running=14)}
    assert core.starts_at_once(call, 16, at_reserve)  # a protected call takes the reserve
    assert not core.starts_at_once(call, 16, at_reserve, sheddable=True)
    assert core.starts_at_once(call, 16, {"x": room(free_slots=3, running=13)}, sheddable=True)


@pytest.mark.parametrize("policy", ["fcfs", "vtc", "justitia", "las"])
def test_blast_every_call_ends_exactly_once_and_no_room_is_promised_twice(policy: str) -> None:
    rng = random.Random(7)
    core = make_core(policy, knee_calls=rng.choice([None, 3]))
    ended: list[str] = []
    produced: dict[str, int] = {}
    active: set[str] = set()
    for step in range(3000):
        now = float(step)
        if rng.random() < 0.2:
            job_id = f"j{step}"
            add_job(core, job_id, nodes=rng.randint(1, 3), now=now, tenant=f"t{step % 3}")
            active.add(job_id)
        snapshot = {
            name: room(free_blocks=rng.randint(0, 12), free_slots=rng.randint(0, 3))
            for name in ("x", "y")
        }
        before = set(core.taking)
        while core.next(now, snapshot) is not None:
            pass
        for name, cap in snapshot.items():  # new calls fit beside those taken before
            taken = [e for e in core.taking.values() if e.backend == name]
            if any(e.call.call_id not in before for e in taken):
                assert len(taken) <= cap.free_slots
                assert sum(cap.blocks_for(e.kv_tokens) for e in taken) <= cap.free_blocks
        for call_id in list(core.taking):
            roll = rng.random()
            if roll < 0.6:
                core.launched(call_id, now)
                produced[call_id] = 0
            elif roll < 0.7:
                core.retry_later(call_id, now + 2)
            elif roll < 0.8:
                core.drop(call_id, now)
                ended.append(call_id)
        for call_id in list(core.running):
            roll = rng.random()
            if roll < 0.3:
                core.finished(call_id, 16, produced.pop(call_id) + rng.randint(0, 9), now)
                ended.append(call_id)
            elif roll < 0.35:
                so_far = produced.pop(call_id)
                if core.lost(call_id, now) is None:
                    core.finished(call_id, 16, so_far, now)
                    ended.append(call_id)
            elif roll < 0.6:
                produced[call_id] += rng.randint(0, 30)
                core.progress(call_id, produced[call_id], now)
        for job_id in list(active):
            calls = (*core.ready, *core.taking, *core.running)
            if not any(c.startswith(job_id + "/") for c in calls):
                core.remove_job(job_id, now)
                active.discard(job_id)
        core.policy.check_invariants()  # type: ignore[attr-defined]
        ready, taking, running = set(core.ready), set(core.taking), set(core.running)
        assert not (ready & taking or ready & running or taking & running)
    assert len(ended) == len(set(ended)) and len(ended) > 100


def test_a_shrunk_batch_leaves_only_its_share_of_slots_busy() -> None:
    core = make_core()
    add_job(core, "a", nodes=4)
    core.batch_fraction = 0.5
    snapshot = {"x": room(free_slots=6, running=2)}  # 8 slots, 2 busy: 2 more may start
    assert core.next(0.0, snapshot) is not None and core.next(0.0, snapshot) is not None
    assert core.next(0.0, snapshot) is None and core.blocked
    core.batch_fraction = 1.0
    assert core.next(0.0, snapshot) is not None


def run_all(core: DispatchCore[str], now: float, slots: int, running: int = 0) -> list[str]:
    """Dispatch into one backend's `slots` free slots, each launch counted in its next
    snapshot as the backend's would; the calls started, in order."""
    started: list[str] = []
    while (dispatch := core.next(now, {"x": room(slots - len(started), running)})) is not None:
        call_id = dispatch.entry.call.call_id
        assert core.launched(call_id, now) is not None
        started.append(call_id)
        running += 1
    return started


def test_a_waiting_protected_call_takes_the_room_of_the_newest_sheddable_call() -> None:
    core = make_core("fcfs")
    add_job(core, "bg", nodes=3, tenant="batch", priority=-1)
    assert run_all(core, 0.0, slots=3) == ["bg/n0", "bg/n1", "bg/n2"]
    add_job(core, "fg", now=1.0, tenant="gold")
    full = {"x": room(free_slots=0, running=3)}
    assert core.next(1.0, full) is None and core.waiting is not None
    [victim] = core.to_yield(1.0, full)
    assert victim is not None and victim.call.call_id == "bg/n2"  # the newest loses least
    assert core.to_yield(1.0, full) == []  # it has its one: its room is not seen free yet
    assert core.yielded("bg/n2", 1.5) is victim and victim.yields == 1
    # its backend does not show the room yet: the waiting call has had its one yield
    assert core.next(1.5, full) is None and core.to_yield(1.5, full) == []
    assert set(core.ready) == {"bg/n2", "fg/n0"}
    # the freed slot goes to the protected call although fcfs puts the older job first
    assert run_all(core, 2.0, slots=1, running=2) == ["fg/n0"]
    core.finished("fg/n0", 16, 16, 3.0)
    # no protected call left: the sheddable one runs again, and a yield is not a loss
    assert run_all(core, 3.0, slots=1, running=2) == ["bg/n2"]
    assert core.lost("bg/n2", 4.0) is victim


def test_a_burst_of_protected_calls_gets_one_yield_each_at_once() -> None:
    core = make_core("fcfs")
    add_job(core, "bg", nodes=4, tenant="batch", priority=-1)
    assert run_all(core, 0.0, slots=4) == ["bg/n0", "bg/n1", "bg/n2", "bg/n3"]
    add_job(core, "g1", now=1.0, tenant="gold")
    add_job(core, "g2", now=1.1, tenant="gold", nodes=2)
    full = {"x": room(free_slots=0, running=4)}
    assert core.next(1.2, full) is None
    victims = core.to_yield(1.2, full)  # the three protected calls' rooms, newest first
    assert [v.call.call_id for v in victims] == ["bg/n3", "bg/n2", "bg/n1"]
    assert core.to_yield(1.2, full) == []  # each waiting call has its one
    # the aborts sent, the backend shows their room (before their streams have ended here)
    started = run_all(core, 1.3, slots=3, running=1)
    assert started == ["g1/n0", "g2/n0", "g2/n1"]
    assert core.to_yield(1.3, full) == []  # nobody else yields for the same calls
    for victim in victims:  # their streams end: they wait among the ready calls
        assert core.yielded(victim.call.call_id, 1.5) is victim
        assert core.next(1.5, full) is None and core.to_yield(1.5, full) == []


def test_a_protected_call_behind_a_waiting_sheddable_one_is_the_one_that_waits() -> None:
    core = make_core("fcfs")
    add_job(core, "bg", nodes=5, tenant="batch", priority=-1)  # older: first in fcfs order
    assert run_all(core, 0.0, slots=3) == ["bg/n0", "bg/n1", "bg/n2"]
    add_job(core, "fg", now=1.0, tenant="gold")
    full = {"x": room(free_slots=0, running=3)}
    assert core.next(1.0, full) is None
    assert core.waiting is not None and core.waiting.call.call_id == "fg/n0"
    assert [v.call.call_id for v in core.to_yield(1.0, full)] == ["bg/n2"]


def test_no_call_yields_to_a_sheddable_call_or_on_a_backend_that_does_not_serve() -> None:
    core = make_core("fcfs")
    add_job(core, "bg", nodes=2, tenant="batch", priority=-1)
    assert run_all(core, 0.0, slots=1) == ["bg/n0"]
    assert core.next(0.0, {"x": room(free_slots=0, running=1)}) is None
    assert core.to_yield(0.0, {"x": room(free_slots=0, running=1)}) == []  # bg/n1 is sheddable
    add_job(core, "fg", now=1.0, tenant="gold")
    assert core.next(1.0, {"x": room(free_slots=0, running=1)}) is None
    assert core.to_yield(1.0, {"x": room(free_slots=0, running=1, healthy=False)}) == []


def test_sheddable_calls_leave_the_reserve_of_slots_free_and_protected_ones_take_it() -> None:
    core = make_core("fcfs")
    add_job(core, "bg", nodes=14, tenant="batch", priority=-1)
    core.sheddable_reserve = 0.25  # 4 of 16 slots
    assert len(run_all(core, 0.0, slots=16)) == 12  # 4 left free, 2 calls left waiting
    assert core.next(0.0, {"x": room(free_slots=4, running=12)}) is None and not core.blocked
    add_job(core, "fg", nodes=4, now=1.0, tenant="gold")
    assert run_all(core, 1.0, slots=4, running=12) == [f"fg/n{i}" for i in range(4)]
    core.sheddable_reserve = 0.0  # the level falls: the waiting sheddable calls may run
    assert run_all(core, 2.0, slots=2, running=16) == ["bg/n12", "bg/n13"]


def test_a_backend_past_its_shrunk_batch_hides_no_other_s_free_slots_from_sheddable_calls() -> None:
    core = make_core("fcfs")
    add_job(core, "bg", tenant="batch", priority=-1)
    core.batch_fraction = 0.5  # x (8 busy of 8) is past its 4; y has 4 of its 8 free
    core.sheddable_reserve = 0.1  # 2 of 16 slots kept from sheddable calls: y has more
    pool = {"x": room(free_slots=0, running=8), "y": room(free_slots=8)}
    dispatch = core.next(0.0, pool)
    assert dispatch is not None and dispatch.entry.backend == "y"


def test_with_share_slots_a_tenant_over_its_share_yields_to_one_under_it() -> None:
    core = make_core("fcfs", share_slots=True)
    add_job(core, "heavy", nodes=5, tenant="h")
    assert run_all(core, 0.0, slots=4) == ["heavy/n0", "heavy/n1", "heavy/n2", "heavy/n3"]
    add_job(core, "light", now=1.0, tenant="l")
    full = {"x": room(free_slots=0, running=4)}
    # fcfs shows heavy/n4 first: a call of the tenant over its share waits, and takes nothing
    assert core.next(1.0, full) is None and core.to_yield(1.0, full) == []
    core.drop("heavy/n4", 1.0)
    assert core.next(1.0, full) is None  # now the light call waits: 2 slots are its share
    [victim] = core.to_yield(1.0, full)
    assert victim is not None and victim.call.call_id == "heavy/n3"
    core.yielded("heavy/n3", 1.5)
    # the freed slot is the light call's, though fcfs would put the heavy job's call first
    assert run_all(core, 2.0, slots=1, running=3) == ["light/n0"]
    # sent: the call that yielded is shown again and runs in the next free slot
    assert run_all(core, 3.0, slots=1, running=4) == ["heavy/n3"]


def heavy_tenant_yields_while_its_quota_holds_it() -> DispatchCore[str]:
    """h runs 3 of 4 slots, its 4th call refused by its quota till 5.0; m runs the 4th slot;
    l's call waits, and h, over its share, yields its newest call (heavy/n2) to it."""
    core = make_core("fcfs", share_slots=True)
    add_job(core, "heavy", nodes=4, tenant="h")
    assert run_all(core, 0.0, slots=3) == ["heavy/n0", "heavy/n1", "heavy/n2"]
    dispatch = core.next(0.0, {"x": room(free_slots=1, running=3)})
    assert dispatch is not None and dispatch.entry.call.call_id == "heavy/n3"
    core.retry_later("heavy/n3", until=5.0)  # QUOTA_CONCURRENT_CALLS
    add_job(core, "other", now=0.5, tenant="m")
    assert run_all(core, 0.5, slots=1, running=3) == ["other/n0"]
    add_job(core, "light", now=1.0, tenant="l")
    full = {"x": room(free_slots=0, running=4)}
    assert core.next(1.0, full) is None
    [victim] = core.to_yield(1.0, full)  # 4 slots among 3 tenants: h keeps 2
    assert victim.call.call_id == "heavy/n2"
    return core


@pytest.mark.parametrize("ends", ["yielded", "finished"])
def test_the_slot_a_share_yield_frees_goes_to_the_call_it_was_given_up_for(ends: str) -> None:
    # the slot freed lifted the quota hold of the yielding tenant at once: its held call,
    # first in fcfs's order, took the slot back, and the light call, yielded to already, got
    # no other yield; so when the call finished (its answer came before the abort) instead
    core = heavy_tenant_yields_while_its_quota_holds_it()
    if ends == "yielded":
        assert core.yielded("heavy/n2", 1.1) is not None
    else:
        core.finished("heavy/n2", 16, 8, 1.1)
    assert run_all(core, 1.2, slots=1, running=3) == ["light/n0"]
    # sent: the slot's concurrency quota is h's again, before its hold's 5.0
    [started] = run_all(core, 2.0, slots=1, running=3)
    assert started.startswith("heavy/")


@pytest.mark.parametrize("gated", [False, True])
def test_a_call_sent_back_after_it_was_yielded_to_is_given_no_second_yield(gated: bool) -> None:
    # its quota (or, gated, the pool's share) refuses the light call once it is taken: it is
    # ready again, unsent, and the slot went back to the heavy call; a second yield to it would
    # abort that call again, and again at each refusal
    core: DispatchCore[str] = DispatchCore(make_policy("fcfs"), share_slots=True, gated=gated)
    add_job(core, "heavy", nodes=4, tenant="h")
    assert run_all(core, 0.0, slots=4) == [f"heavy/n{i}" for i in range(4)]
    add_job(core, "light", now=1.0, tenant="l")
    full = {"x": room(free_slots=0, running=4)}
    assert core.next(1.0, full) is None
    [victim] = core.to_yield(1.0, full)
    assert core.yielded(victim.call.call_id, 1.1) is not None
    dispatch = core.next(1.2, {"x": room(free_slots=1, running=3)})
    assert dispatch is not None and dispatch.entry.call.call_id == "light/n0"
    assert core.next(1.2, {"x": room(free_slots=1, running=3)}) is None  # its room is promised
    core.retry_later("light/n0", until=1.5, quota=not gated)
    assert run_all(core, 1.3, slots=1, running=3) == [victim.call.call_id]
    assert core.next(2.0, full) is None and core.waiting is not None
    assert core.waiting.call.call_id == "light/n0"
    assert core.to_yield(2.0, full) == []


def test_a_protected_call_never_gives_its_share_to_a_sheddable_one() -> None:
    # the sheddable tenant runs under its share, but a protected call that yielded to it would
    # wait as a protected call and take the room back at once: both aborted again and again
    core = make_core("fcfs", share_slots=True)
    add_job(core, "heavy", nodes=4, tenant="h")
    assert run_all(core, 0.0, slots=4) == [f"heavy/n{i}" for i in range(4)]
    add_job(core, "bg", now=1.0, tenant="s", priority=-1)
    full = {"x": room(free_slots=0, running=4)}
    assert core.next(1.0, full) is None and core.blocked
    assert core.to_yield(1.0, full) == []


def test_no_share_is_taken_without_share_slots_or_below_the_giver_s_own_share() -> None:
    full = {"x": room(free_slots=0, running=4)}

    def three_tenants(share_slots: bool) -> DispatchCore[str]:
        core = make_core("fcfs", share_slots=share_slots)
        add_job(core, "heavy", nodes=3, tenant="h")
        add_job(core, "other", nodes=1, tenant="o")
        assert run_all(core, 0.0, slots=4) == ["heavy/n0", "heavy/n1", "heavy/n2", "other/n0"]
        add_job(core, "light", now=1.0, tenant="l")
        assert core.next(1.0, full) is None
        return core

    assert three_tenants(share_slots=False).to_yield(1.0, full) == []
    # 4 slots among 3 tenants, 4/3 each: h runs 3 and would keep 2: it yields
    [victim] = three_tenants(share_slots=True).to_yield(1.0, full)
    assert victim is not None and victim.call.call_id == "heavy/n2"

    even = make_core("fcfs", share_slots=True)
    add_job(even, "heavy", nodes=2, tenant="h")
    add_job(even, "other", nodes=2, tenant="o")
    assert len(run_all(even, 0.0, slots=4)) == 4
    add_job(even, "light", now=1.0, tenant="l")
    # h and o run 2 each: either would keep 1, under its share of 4/3: nobody yields
    assert even.next(1.0, full) is None and even.to_yield(1.0, full) == []


def heavy_in_every_slot() -> DispatchCore[str]:
    """Justitia with `share_slots` and a knee of 6: tenant h, alone, runs 12 calls in all 12
    slots (the knee binds for nobody yet)."""
    core = make_core("justitia", knee_calls=6, share_slots=True)
    add_job(core, "heavy", nodes=12, tenant="h")
    assert run_all(core, 0.0, slots=12) == [f"heavy/n{i}" for i in range(12)]
    return core


def test_with_share_slots_the_batch_is_held_at_the_knee_while_a_tenant_is_under_its_share() -> None:
    # justitia puts the light tenant's calls first (fcfs would show h's held ones, and the
    # light call behind them would wait for the knee with them)
    core = heavy_in_every_slot()  # one tenant alone: the knee does not bind, it fills them
    add_job(core, "light", now=1.0, tenant="l")
    full = {"x": room(free_slots=0, running=12)}
    assert core.knee_cap(full) == 6  # l has none of its 3, h runs 12
    assert core.next(1.0, full) is None and core.waiting is not None
    # the batch back to the knee with a slot for the light call: h's seven newest, at once
    victims = core.to_yield(1.0, full)
    assert [v.call.call_id for v in victims] == [f"heavy/n{i}" for i in range(11, 4, -1)]
    assert core.to_yield(1.0, full) == []  # chosen once
    for victim in victims:
        assert core.yielded(victim.call.call_id, 1.5) is victim
    # seven slots free, but h may fill only the knee's six: the light call, not h's
    assert run_all(core, 2.0, slots=7, running=5) == ["light/n0"]
    past_knee = {"x": room(free_slots=6, running=6)}
    assert core.next(2.0, past_knee) is None
    assert core.to_yield(2.0, past_knee) == []  # h waits its turn
    # the light tenant's next call takes a slot past the knee at once: no abort for it
    add_job(core, "light2", now=2.5, tenant="l")
    assert run_all(core, 2.5, slots=6, running=6) == ["light2/n0"]
    assert core.to_yield(2.5, {"x": room(free_slots=5, running=7)}) == []
    core.finished("light/n0", 16, 16, 3.0)
    core.finished("light2/n0", 16, 16, 3.0)  # l has nothing left: the batch fills again
    assert sorted(run_all(core, 3.0, slots=7, running=5)) == sorted(v.call.call_id for v in victims)


def test_the_knee_does_not_bind_for_a_tenant_whose_only_calls_are_held_with_their_job() -> None:
    # a held job (its replica's lease on it may have lapsed) sends nothing until let go: its
    # tenant held every other tenant at the knee for nothing
    core = heavy_in_every_slot()
    add_job(core, "light", now=1.0, tenant="l")
    full = {"x": room(free_slots=0, running=12)}
    assert core.knee_cap(full, 1.0) == 6
    core.hold_job("light")
    assert core.knee_cap(full, 1.0) is None
    assert core.next(1.0, full) is None and core.to_yield(1.0, full) == []
    core.unhold_job("light")
    assert core.knee_cap(full, 1.0) == 6


def test_the_knee_binds_only_for_a_tenant_under_its_share_and_takes_none_below_it() -> None:
    core = make_core("fcfs", knee_calls=4, share_slots=True)
    add_job(core, "a", nodes=4, tenant="a")
    add_job(core, "b", nodes=4, tenant="b")
    assert len(run_all(core, 0.0, slots=8)) == 8
    full = {"x": room(free_slots=0, running=8)}
    # both over their shares of the knee, neither under: the full batch serves them
    assert core.knee_cap(full) is None and core.to_yield(0.0, full) == []
    add_job(core, "light", now=1.0, tenant="l")
    assert core.next(1.0, full) is None
    # 4/3 of the knee each: a and b keep 2 each, not below their shares (5 > 4 left)
    victims = core.to_yield(1.0, full)
    assert sorted(v.call.call_id for v in victims) == ["a/n2", "a/n3", "b/n2", "b/n3"]
    without = make_core("fcfs", knee_calls=4)  # no share_slots: the knee holds no slot
    add_job(without, "a", nodes=8, tenant="a")
    assert len(run_all(without, 0.0, slots=8)) == 8
    add_job(without, "light", now=1.0, tenant="l")
    assert without.knee_cap(full) is None and without.to_yield(1.0, full) == []


def test_a_sheddable_light_call_takes_no_protected_call_s_room_at_the_knee() -> None:
    # a protected call never yields to a sheddable one (it would take the room back at once,
    # and the sheddable call would yield in its turn), nor is it held below the knee for one
    core = heavy_in_every_slot()
    add_job(core, "light", now=1.0, tenant="l", priority=-1)
    full = {"x": room(free_slots=0, running=12)}
    assert core.next(1.0, full) is None and core.waiting is not None
    assert core.waiting.call.call_id == "light/n0"
    assert core.to_yield(1.0, full) == []
    # h's next call may still go past the knee: the light tenant has only a sheddable call
    add_job(core, "heavy2", now=2.0, tenant="h")
    core.finished("heavy/n0", 16, 16, 2.0)
    core.finished("heavy/n1", 16, 16, 2.0)
    assert sorted(run_all(core, 2.0, slots=2, running=10)) == ["heavy2/n0", "light/n0"]


def test_no_call_yields_past_the_knee_to_a_call_that_may_not_go_past_it() -> None:
    core = make_core("fcfs", knee_calls=6, share_slots=True)
    add_job(core, "heavy", nodes=11, tenant="h")
    assert len(run_all(core, 0.0, slots=12)) == 11
    add_job(core, "light", now=0.5, tenant="l")
    assert run_all(core, 0.5, slots=1, running=11) == ["light/n0"]
    add_job(core, "med", nodes=5, now=1.0, tenant="m")  # under its share, but not light
    full = {"x": room(free_slots=0, running=12)}
    assert core.knee_cap(full) == 6
    assert core.next(1.0, full) is None and core.waiting is not None
    assert core.waiting.call.call_id == "med/n0"
    # the slot h's newest call would leave is past the knee, where m's calls may not go
    assert core.to_yield(1.0, full) == []
    # with the batch back at the knee, h gives m a slot below it
    for i in range(5, 11):
        core.finished(f"heavy/n{i}", 16, 16, 2.0)
    at_knee = {"x": room(free_slots=6, running=6)}
    assert core.next(2.0, at_knee) is None
    [victim] = core.to_yield(2.0, at_knee)
    assert victim.call.call_id == "heavy/n4"
    assert core.yielded("heavy/n4", 2.5) is victim
    assert run_all(core, 3.0, slots=7, running=5) == ["med/n0"]


def test_the_knee_does_not_bind_for_a_tenant_its_own_quota_holds_back() -> None:
    # a tenant past its quota makes only itself wait: its held call gains nothing from the knee
    core = make_core("justitia", knee_calls=6, share_slots=True)
    add_job(core, "light", tenant="l")
    taken = core.next(0.0, {"x": room(free_slots=12)})
    assert taken is not None and taken.entry.call.call_id == "light/n0"
    core.retry_later("light/n0", until=100.0)
    add_job(core, "heavy", nodes=20, tenant="h")
    assert len(run_all(core, 1.0, slots=12)) == 12
    # once its hold lapses, its call is light again: h's next calls stay below the knee
    core.finished("heavy/n0", 16, 16, 100.0)
    core.finished("heavy/n1", 16, 16, 100.0)
    assert run_all(core, 100.0, slots=2, running=10) == ["light/n0"]


def test_while_the_knee_binds_each_backend_is_held_at_its_own_knee() -> None:
    core = make_core("fcfs", knee_calls=6, share_slots=True)  # 6 a backend, whatever its slots
    add_job(core, "heavy", nodes=12, tenant="h")
    for k in range(6):  # 6 on the small backend, then 6 on the large one
        assert core.next(0.0, {"a": room(8 - k, k), "b": room(0)}) is not None
        assert core.launched(f"heavy/n{k}", 0.0) is not None
    for k in range(6):
        assert core.next(0.0, {"a": room(2, 6), "b": room(16 - k, k)}) is not None
        assert core.launched(f"heavy/n{k + 6}", 0.0) is not None
    add_job(core, "light", now=1.0, tenant="l")
    light = core.next(1.0, {"a": room(0, 8), "b": room(10, 6)})
    assert light is not None and light.entry.backend == "b"
    assert core.launched("light/n0", 1.0) is not None
    add_job(core, "heavy2", now=2.0, tenant="h")
    both = {"a": room(2, 6), "b": room(9, 7)}
    assert core.knee_cap(both) == 12
    # h is at the knee on each: none past b's 6 (the pool's 12 / 24 slots would allow 8)
    assert core.next(2.0, both) is None


def test_weights_size_the_shares() -> None:
    core = make_core("fcfs", share_slots=True)
    costs = (NodeCost("n0", (), 16, 16.0, 64),)
    core.add_job(JobInfo("heavy", "h", 3.0, 0.0, costs), 0.0)
    add_job(core, "heavy2", nodes=3, tenant="h")  # the tenant's latest job says weight 1
    core.add_job(JobInfo("heavy3", "h", 3.0, 0.0, costs), 0.0)  # and now 3 again
    assert run_all(core, 0.0, slots=3) == ["heavy2/n0", "heavy2/n1", "heavy2/n2"]
    add_job(core, "light", now=1.0, tenant="l")
    full = {"x": room(free_slots=0, running=3)}
    # weights 3:1 over 3 slots: the light tenant's share is 3/4 of a slot, under one call
    assert core.next(1.0, full) is None and core.to_yield(1.0, full) == []
    core.add_job(JobInfo("heavy4", "h", 1.0, 2.0, costs), 2.0)  # weights 1:1: 1.5 slots each
    assert core.next(2.0, full) is None
    [victim] = core.to_yield(2.0, full)
    assert victim is not None and victim.call.tenant_id == "h"


def test_with_the_pool_s_share_every_call_is_granted_before_it_is_sent() -> None:
    core: DispatchCore[str] = DispatchCore(make_policy("vtc"), gated=True)
    core.add_job(JobInfo("a", "t", 2.0, 0.0, (NodeCost("n", (), 4, 4.0, 8),)), 0.0)
    core.add_ready(ReadyCall("a/n", "a", "t", "n", 4, 4.0, 8), 4, "payload", 0.0, reserved=True)
    dispatch = core.next(0.0, {"x": room()})
    assert dispatch is not None and dispatch.taken
    assert dispatch.needs_grant and not dispatch.needs_reserve  # reserved with its job
    assert core.charge(dispatch.entry) == kv_token_time(4, 8) / 2.0  # worst case, per weight
    assert core.heads(0.0) == (("t",), {})  # taken, so not waiting


def test_a_shared_pool_tells_the_policy_which_running_calls_are_its_jobs() -> None:
    # other replicas' calls fill the server too: the policy's backlog is drained by its own
    for gated in (False, True):
        core: DispatchCore[str] = DispatchCore(make_policy("justitia"), gated=gated)
        add_job(core, "a", nodes=2)
        first = core.next(0.0, {"x": room()})
        assert first is not None and core.launched(first.entry.call.call_id, 0.0) is not None
        assert core.next(0.0, {"x": room(running=1)}) is not None  # taken, not yet launched
        load = core.load({"x": room(running=6, waiting=1)})  # its first call among the 6
        assert load.running_calls == 8
        assert load.own_calls == (2 if gated else None)


def test_a_share_refusal_keeps_the_tenant_waiting_and_a_quota_refusal_does_not() -> None:
    core: DispatchCore[str] = DispatchCore(make_policy("vtc"), gated=True)
    add_job(core, "a", tenant="t1")
    add_job(core, "b", tenant="t2")
    first, second = core.next(0.0, {"x": room()}), core.next(0.0, {"x": room()})
    assert first is not None and second is not None
    core.retry_later(first.entry.call.call_id, 1.0, quota=False)
    core.retry_later(second.entry.call.call_id, 1.0)
    assert core.heads(0.5) == (("t1", "t2"), {"t1": 0.0})  # t2 could send nothing now
    assert core.heads(1.0) == (("t1", "t2"), {"t1": 0.0, "t2": 0.0})  # hold over


def test_no_tenant_waits_in_the_pool_s_share_while_no_backend_serves_here() -> None:
    core: DispatchCore[str] = DispatchCore(make_policy("vtc"), gated=True)
    add_job(core, "a", tenant="t1")
    down = {"x": room(healthy=False), "y": room(healthy=False)}
    assert core.next(0.0, down) is None
    assert core.heads(0.0, serving=False) == (("t1",), {})  # active, but it could send nothing
    assert core.heads(0.0, serving=True) == (("t1",), {"t1": 0.0})


def test_justitia_s_heads_give_each_waiting_tenant_its_least_job_offset() -> None:
    core: DispatchCore[str] = DispatchCore(make_policy("justitia"), gated=True)
    add_job(core, "short", nodes=1, tenant="t1")
    add_job(core, "long", nodes=3, tenant="t1")
    add_job(core, "other", nodes=3, tenant="t2")
    call = kv_token_time(16, 16)
    assert core.heads(0.0) == (("t1", "t2"), {"t1": call, "t2": 3 * call})
    dispatch = core.next(0.0, {"x": room()})
    assert dispatch is not None and dispatch.entry.call.job_id == "short"
    assert core.offset(dispatch.entry, 0.0) == call  # taken: still its job's to pay for
    assert core.launched(dispatch.entry.call.call_id, 0.0) is not None
    # dispatched, it is in its tenant's service: t1's least offset is now "long"'s
    assert core.heads(0.0)[1] == {"t1": 3 * call, "t2": 3 * call}
    long_call = core.next(0.0, {"x": room()})
    assert long_call is not None and long_call.entry.call.job_id == "other"
    # a tenant asks at its least offset here, whichever of its jobs the call is of
    add_job(core, "tiny", nodes=1, tenant="t2", predicted=1.0)
    assert core.offset(long_call.entry, 0.0) == kv_token_time(16, 1)


def test_a_tenant_asks_at_no_offset_of_a_job_that_cannot_send() -> None:
    # a held job (its lease may have lapsed) is not published: asking at its offset would put
    # the tenant's other job ahead of where the pool sees the tenant waiting
    core: DispatchCore[str] = DispatchCore(make_policy("justitia"), gated=True)
    add_job(core, "short", nodes=1, tenant="t1")
    add_job(core, "long", nodes=3, tenant="t1")
    core.hold_job("short")
    call = kv_token_time(16, 16)
    assert core.heads(0.0) == (("t1",), {"t1": 3 * call})
    dispatch = core.next(0.0, {"x": room()})
    assert dispatch is not None and dispatch.entry.call.job_id == "long"
    assert core.offset(dispatch.entry, 0.0) == 3 * call


def test_first_come_first_served_is_granted_free_at_each_job_s_arrival() -> None:
    core: DispatchCore[str] = DispatchCore(make_policy("fcfs"), gated=True)
    add_job(core, "late", now=7.0, tenant="t1")
    add_job(core, "early", now=3.0, tenant="t1")
    add_job(core, "other", now=5.0, tenant="t2")
    assert core.heads(7.0) == (("t1", "t2"), {"t1": 3.0, "t2": 5.0})  # the least arrival
    dispatch = core.next(7.0, {"x": room()})
    assert dispatch is not None and dispatch.needs_grant
    assert dispatch.entry.call.job_id == "early" and core.charge(dispatch.entry) == 0.0
    assert core.offset(dispatch.entry, 0.0) == 3.0
    core.granted(dispatch.entry.call.call_id, "t1", 0.0, 3.0)
    entry = core.launched(dispatch.entry.call.call_id, 7.0)
    assert entry is not None and entry.priority == 3.0  # the server runs it at its arrival


def test_a_granted_call_is_sent_at_its_key_in_the_pool_s_order() -> None:
    core: DispatchCore[str] = DispatchCore(make_policy("justitia"), gated=True)
    add_job(core, "a", nodes=2)
    dispatch = core.next(0.0, {"x": room()})
    assert dispatch is not None
    core.granted("a/n0", "t", core.charge(dispatch.entry), 123.5)
    entry = core.launched("a/n0", 0.0)
    assert entry is not None and entry.priority == 123.5  # not the replica's own tag
    assert core.progress("a/n0", 40, 1.0) == []  # past its prediction: re-keyed, not resent


def test_a_grant_that_lands_after_its_call_left_is_owed_back() -> None:
    core: DispatchCore[str] = DispatchCore(make_policy("vtc"), gated=True)
    add_job(core, "a")
    dispatch = core.next(0.0, {"x": room()})
    assert dispatch is not None
    core.remove_job("a", 0.0)
    core.granted("a/n0", "t", 5.0, 1.0)
    assert core.take_owed() == {"t": -5.0} and core.take_owed() == {}


def test_blast_every_grant_is_trued_up_to_what_its_attempt_used() -> None:
    rng = random.Random(11)
    core: DispatchCore[str] = DispatchCore(make_policy("justitia"), gated=True)
    charged: dict[str, float] = {}  # grants plus what was owed, per tenant
    used: dict[str, float] = {}  # KV token-time of every attempt that ran, per tenant
    produced: dict[str, int] = {}
    active: set[str] = set()
    granted_only: list[str] = []  # taken and granted, not launched yet

    def pay() -> None:
        for tenant, amount in core.take_owed().items():
            charged[tenant] = charged.get(tenant, 0.0) + amount

    def ran(call_id: str, output: int) -> None:
        tenant = core.running[call_id].call.tenant_id
        used[tenant] = used.get(tenant, 0.0) + kv_token_time(16, output)

    for step in range(2000):
        now = float(step)
        if rng.random() < 0.2:
            job_id = f"j{step}"
            add_job(core, job_id, nodes=rng.randint(1, 3), now=now, tenant=f"t{step % 3}")
            active.add(job_id)
        for job_id in list(active):
            if rng.random() < 0.02:  # cancelled, whatever its calls are doing
                core.remove_job(job_id, now)
                active.discard(job_id)
        for call_id in granted_only:
            if core.launched(call_id, now) is not None:
                produced[call_id] = 0
        granted_only.clear()
        while (dispatch := core.next(now, {"x": room(free_slots=rng.randint(0, 3))})) is not None:
            entry = dispatch.entry
            roll = rng.random()
            if roll < 0.2:
                core.retry_later(entry.call.call_id, now + 1, quota=False)  # not granted
                continue
            tenant = entry.call.tenant_id
            charged[tenant] = charged.get(tenant, 0.0) + core.charge(entry)
            core.granted(entry.call.call_id, tenant, core.charge(entry), 0.0)
            if roll < 0.3:
                core.retry_later(entry.call.call_id, now + 1)  # a quota refused it
            elif roll < 0.35:
                core.drop(entry.call.call_id, now)
            elif roll < 0.5:
                granted_only.append(entry.call.call_id)  # launched later, if its job stays
            else:
                core.launched(entry.call.call_id, now)
                produced[entry.call.call_id] = 0
        for call_id in list(core.running):
            roll = rng.random()
            if roll < 0.3:
                output = produced.pop(call_id) + rng.randint(0, 9)
                ran(call_id, output)
                core.finished(call_id, 16, output, now)
            elif roll < 0.35:
                ran(call_id, produced[call_id])
                if core.lost(call_id, now) is None:
                    core.finished(call_id, 16, produced[call_id], now)
                produced.pop(call_id)
            elif roll < 0.6:
                produced[call_id] += rng.randint(0, 30)
                core.progress(call_id, produced[call_id], now)
        for job_id in list(active):
            if not any(
                c.startswith(job_id + "/") for c in (*core.ready, *core.taking, *core.running)
            ):
                core.remove_job(job_id, now)
                active.discard(job_id)
        if rng.random() < 0.5:
            pay()
    for call_id in list(core.running):  # the calls still running end
        ran(call_id, produced[call_id])
        core.finished(call_id, 16, produced.pop(call_id), 2000.0)
    for job_id in active:
        core.remove_job(job_id, 2000.0)
    pay()
    assert charged.keys() == used.keys() and len(used) == 3
    for tenant, amount in used.items():
        assert charged[tenant] == pytest.approx(amount, rel=1e-9), tenant


def test_a_tenant_whose_jobs_all_left_leaves_nothing_behind() -> None:
    """Each tenant ever seen kept its weight and quota hold for good: memory that grew with
    tenant churn."""
    core: DispatchCore[str] = DispatchCore(make_policy("fcfs"))
    room = {"x": BackendCapacity(10_000, 16, 64, 0, 0, True)}
    now = 0.0
    for i in range(50):
        tenant, job = f"tenant-{i}", f"job-{i}"
        core.add_job(JobInfo(job, tenant, 2.0, now, (NodeCost("n", (), 16, 8.0, 32),)), now)
        call = ReadyCall(f"{job}/n", job, tenant, "n", 16, 8.0, 32)
        core.add_ready(call, 8, "p", now)
        assert core.next(now, room) is not None
        core.retry_later(call.call_id, now + 0.5)  # its quota said "later" once
        now += 1.0
        assert core.next(now, room) is not None
        core.launched(call.call_id, now)
        core.finished(call.call_id, 16, 8, now)
        core.remove_job(job, now)
    assert (core.book.weights, core.book.quota_until) == ({}, {})
