"""The room a pool's backends offer the calls a dispatch core sends: arithmetic over snapshots.

A backend's capacity snapshot (`BackendCapacity`) says what it holds and what it has free; the
core (`gateway.dispatch_core`) takes from it what the calls it is still sending were promised
there (they are not in the snapshot yet), cuts its slots to the share of the batch that may be
busy (under overload, or below a knee), and reads the pool's knee from the knee setting and the
backends' own measures. Pure: no I/O and no clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

from gateway.backends.base import BackendCapacity
from gateway.core_call import CoreCall, Knee

T = TypeVar("T")


def rooms_left(
    capacities: Mapping[str, BackendCapacity],
    taking: Iterable[CoreCall[T]],
    fraction: float | Mapping[str, float] = 1.0,
    batch_fraction: float = 1.0,
) -> dict[str, BackendCapacity]:
    """Each backend's room less what the calls being taken there were promised, its slots cut
    to `batch_fraction` of them (or to `fraction`, or its own in a mapping, when that is
    less)."""
    rooms = dict(capacities)
    for name, capacity in capacities.items():
        cut = fraction.get(name, 1.0) if isinstance(fraction, Mapping) else fraction
        cut = min(cut, 1.0, batch_fraction)
        if cut < 1.0:
            rooms[name] = _shrunk(capacity, cut)
    for entry in taking:
        room = rooms.get(entry.backend)
        if room is not None:
            rooms[entry.backend] = _less(room, room.blocks_for(entry.kv_tokens))
    return rooms


def pool_knee(knee_calls: Knee, capacities: Mapping[str, BackendCapacity]) -> int | None:
    """The knee of the backends that serve, summed (with "auto", none until every one of them
    has measured its own)."""
    serving = [c for c in capacities.values() if c.healthy]
    if knee_calls == "auto":
        knees = [c.knee_calls for c in serving]
        if serving and all(k is not None for k in knees):
            return sum(k for k in knees if k is not None)
        return None
    if knee_calls is None:
        return None
    return knee_calls * max(len(serving), 1)


def knee_fractions(knee_calls: Knee, capacities: Mapping[str, BackendCapacity]) -> dict[str, float]:
    """The share of each backend's slots below its own knee (a pool-wide fraction would put a
    larger backend's calls past its knee and hold a smaller one's below it)."""
    fractions = {}
    for name, room in capacities.items():
        knee = room.knee_calls if knee_calls == "auto" else knee_calls
        fractions[name] = 1.0 if knee is None else knee / max(slots(room), 1)
    return fractions


def serving_slots(capacities: Mapping[str, BackendCapacity]) -> int:
    """The batch slots of the backends that serve: busy or free."""
    return sum(slots(r) for r in capacities.values() if r.healthy)


def slots(room: BackendCapacity) -> int:
    """The backend's batch slots: busy or free."""
    return room.running + room.waiting + room.free_slots


def shrunk_slots(room: BackendCapacity, fraction: float) -> int:
    """The backend's slots that may be busy within `fraction` of them (one at least)."""
    # (a fraction computed as slots over slots must not lose one to rounding)
    return max(1, math.floor(slots(room) * fraction + 1e-9))


def _shrunk(room: BackendCapacity, fraction: float) -> BackendCapacity:
    """The room left when at most `fraction` of the backend's slots may be busy: none, not less
    than none, for a backend past it already (free slots are summed over the pool, where one
    backend's excess must not hide another's room)."""
    free = min(room.free_slots, shrunk_slots(room, fraction) - room.running - room.waiting)
    return dataclasses.replace(room, free_slots=max(free, 0))


def _less(room: BackendCapacity, blocks: int) -> BackendCapacity:
    return dataclasses.replace(
        room, free_blocks=room.free_blocks - blocks, free_slots=max(room.free_slots - 1, 0)
    )
