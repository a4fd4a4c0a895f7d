"""Routing a call within a pool: room first, then the predicted finish, then prefix affinity."""

from __future__ import annotations

import pytest

from gateway.backends import BackendCapacity
from gateway.routing import Router
from tenants.policies import ReadyCall
from tests.gateway.factories import room


def call(job_id: str = "j") -> ReadyCall:
    return ReadyCall(f"{job_id}/a", job_id, "t", "a", 16, 100.0, 256)


def test_only_a_healthy_backend_with_a_slot_and_the_blocks_takes_a_call() -> None:
    router = Router()
    rooms = {"down": room(healthy=False), "full": room(free_slots=0), "small": room(free_blocks=7)}
    assert router.route(call(), 116, rooms) is None  # 116 tokens need 8 blocks
    assert router.route(call(), 116, {**rooms, "ok": room(free_blocks=8)}) == "ok"


def test_with_no_speeds_known_the_least_loaded_backend_wins() -> None:
    router = Router()
    rooms = {
        "a": room(free_slots=2),
        "b": room(free_slots=5),
        "c": room(free_slots=5, free_blocks=90),
    }
    assert router.route(call(), 116, rooms) == "b"


def test_the_backend_predicted_to_finish_first_wins() -> None:
    router = Router()
    router.observe("slow", ttft_s=0.5, tpot_s=0.05)
    router.observe("fast", ttft_s=0.5, tpot_s=0.01)
    rooms = {"slow": room(free_slots=8), "fast": room(free_slots=1)}
    assert router.route(call(), 116, rooms) == "fast"
    router.observe("fresh", ttft_s=9.0, tpot_s=9.0)  # seen once: a bad sample counts in full
    assert router.route(call(), 116, {**rooms, "fresh": room()}) == "fast"


def test_speeds_are_averaged_so_one_sample_does_not_flip_the_choice() -> None:
    router = Router()
    for _ in range(10):
        router.observe("a", 0.1, 0.01)
        router.observe("b", 0.1, 0.012)
    router.observe("a", 0.1, 0.02)  # one slow call on a
    assert router.route(call(), 116, {"a": room(), "b": room()}) == "a"


def test_a_job_stays_on_its_backend_while_that_costs_little() -> None:
    router = Router(affinity_margin=0.2)
    router.observe("a", 0.0, 0.011)
    router.observe("b", 0.0, 0.010)
    router.sent(call("j"), "a")
    assert router.route(call("j"), 116, {"a": room(), "b": room()}) == "a"  # 10 % slower
    assert router.route(call("other"), 116, {"a": room(), "b": room()}) == "b"
    router.observe("a", 0.0, 0.1)  # now far slower: affinity no longer pays
    assert router.route(call("j"), 116, {"a": room(), "b": room()}) == "b"


def test_a_forgotten_job_has_no_affinity() -> None:
    router = Router(affinity_margin=0.2)
    router.observe("a", 0.0, 0.011)
    router.observe("b", 0.0, 0.010)
    router.sent(call("j"), "a")
    router.forget("j")  # the job ended
    assert router.route(call("j"), 116, {"a": room(), "b": room()}) == "b"


def test_a_negative_margin_is_refused() -> None:
    with pytest.raises(ValueError, match="affinity_margin"):
        Router(affinity_margin=-0.1)


def test_a_fuller_batch_stretches_the_predicted_finish() -> None:
    router = Router(affinity_margin=0.2)
    quiet = BackendCapacity(100, 16, 6, 2, 0, True)  # 2 of 8 slots busy: x1.25
    busy = BackendCapacity(100, 16, 2, 6, 0, True)  # 6 of 8: x1.75
    assert router.route(call(), 116, {"quiet": quiet, "busy": busy}) == "quiet"
    router.sent(call("j"), "busy")
    # the job's backend is 40 % slower now: past the margin, its next call moves
    assert router.route(call("j"), 116, {"quiet": quiet, "busy": busy}) == "quiet"
