"""Freezing the start-up heap: what is alive is frozen, garbage is collected first."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest

from engine.heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the suite runs with the collector as it was


def test_live_objects_are_frozen_and_garbage_cycles_are_collected_first() -> None:
    kept = Node()
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle only the full collector frees
    gone = weakref.ref(a)
    del a, b
    # a thread left by an earlier test that frees a frozen object takes it out of the count:
    # no other thread runs between the freeze and the count read back
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        frozen = freeze_startup_heap()
        count = gc.get_freeze_count()
    finally:
        sys.setswitchinterval(interval)
    assert gone() is None  # collected, not frozen forever
    assert frozen == count > 0
    assert not any(obj is kept for obj in gc.get_objects())  # tracked objects left: not it
