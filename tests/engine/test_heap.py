"""Freezing the start-up heap: what is alive is frozen, garbage is collected first."""

from __future__ import annotations

import gc
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
    frozen = freeze_startup_heap()
    assert gone() is None  # collected, not frozen forever
    assert frozen == gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # tracked objects left: not it
