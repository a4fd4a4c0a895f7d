"""A backend's room as the gateway reads it (`BackendCapacity`)."""

from __future__ import annotations

import pytest

from gateway.backends import BackendCapacity


@pytest.mark.parametrize(
    ("free_blocks", "usage"), [(100, 0.0), (25, 0.75), (-40, 1.0), (140, 0.0), (0, 1.0)]
)
def test_kv_usage_stays_in_0_1_when_a_backend_was_sent_more_than_its_pool(
    free_blocks: int, usage: float
) -> None:
    """What a backend was sent counts before it admits it, so its free blocks can fall below 0
    (the Prometheus gauge said 1.4) or, scraped, pass its pool: the status and the gauge say
    at most all of it, and at least none."""
    room = BackendCapacity(free_blocks, 16, 4, 0, 0, True, total_blocks=100)
    assert room.kv_usage == usage
    assert BackendCapacity(free_blocks, 16, 4, 0, 0, True).kv_usage is None
