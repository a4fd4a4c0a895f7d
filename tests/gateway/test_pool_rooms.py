"""The room a pool's backends offer, from their capacity snapshots (`gateway.pool_rooms`)."""

from __future__ import annotations

from gateway.core_call import CoreCall
from gateway.pool_rooms import (
    knee_fractions,
    pool_knee,
    rooms_left,
    serving_slots,
    shrunk_slots,
)
from tenants.policies import ReadyCall
from tests.gateway.factories import room


def taken(backend: str, prompt: int, reserve: int) -> CoreCall[None]:
    call = ReadyCall("j/n", "j", "t", "n", prompt, float(reserve), reserve)
    return CoreCall(call, reserve, None, backend=backend)


def test_a_call_being_taken_holds_a_slot_and_its_blocks_where_it_goes() -> None:
    rooms = rooms_left({"a": room(), "b": room()}, [taken("a", 20, 40)])  # 60 tokens: 4 blocks
    assert (rooms["a"].free_slots, rooms["a"].free_blocks) == (7, 96)
    assert rooms["b"] == room()
    assert rooms_left({"a": room()}, [taken("gone", 20, 40)]) == {"a": room()}


def test_a_fraction_cuts_the_slots_that_may_be_busy_the_smaller_of_the_two() -> None:
    # 12 slots, 4 busy: at half, 6 may be busy, so 2 are free
    half = rooms_left({"a": room(free_slots=8, running=4)}, [], 0.5)
    assert half["a"].free_slots == 2
    per_backend = {"a": room(free_slots=8, running=4), "b": room(free_slots=8, running=4)}
    cut = rooms_left(per_backend, [], {"a": 0.5}, batch_fraction=0.75)
    assert (cut["a"].free_slots, cut["b"].free_slots) == (2, 5)  # b: 9 of 12 may be busy
    full = rooms_left({"a": room(free_slots=2, running=10)}, [], 0.5)
    assert full["a"].free_slots == 0  # past the cut already: no call fits, and none is owed


def test_no_backend_s_room_is_less_than_none() -> None:
    """Free slots are summed over the pool (the sheddable reserve, the overload level): a
    backend past its shrunk batch, or promised more than it had, must not hide another's."""
    pool = {"x": room(free_slots=0, running=8), "y": room(free_slots=8)}
    halved = rooms_left(pool, [taken("x", 20, 40)], batch_fraction=0.5)
    assert (halved["x"].free_slots, halved["y"].free_slots) == (0, 4)
    promised = rooms_left({"a": room(free_slots=1)}, [taken("a", 20, 40), taken("a", 20, 40)])
    assert promised["a"].free_slots == 0


def test_shrunk_slots_keep_one_and_lose_none_to_rounding() -> None:
    assert shrunk_slots(room(free_slots=1, running=0), 0.1) == 1
    assert shrunk_slots(room(free_slots=22, running=0), 15 / 22) == 15  # (15 / 22) * 22 < 15
    assert serving_slots({"a": room(), "b": room(healthy=False), "c": room(4, 4)}) == 16


def test_the_pool_s_knee_is_the_sum_of_its_serving_backends_knees() -> None:
    pool = {"a": room(knee=6), "b": room(knee=10), "down": room(healthy=False)}
    assert pool_knee("auto", pool) == 16
    assert pool_knee(4, pool) == 8  # a number is per serving backend
    assert pool_knee(None, pool) is None
    assert pool_knee("auto", {**pool, "c": room()}) is None  # one has measured none yet
    assert pool_knee("auto", {"down": room(healthy=False)}) is None
    assert pool_knee(4, {"down": room(healthy=False)}) == 4


def test_each_backend_is_cut_at_its_own_knee() -> None:
    pool = {"small": room(free_slots=8, knee=4), "large": room(free_slots=32, knee=4)}
    assert knee_fractions("auto", pool) == {"small": 0.5, "large": 0.125}
    assert knee_fractions(8, pool) == {"small": 1.0, "large": 0.25}
    assert knee_fractions(None, pool) == {"small": 1.0, "large": 1.0}
    unmeasured = {"a": room(free_slots=8)}
    assert knee_fractions("auto", unmeasured) == {"a": 1.0}
