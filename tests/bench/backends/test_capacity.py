"""The capacity probe's arithmetic on hand-made call records."""

import pytest

from bench.backends.capacity import measure_capacity, saturated_spans
from bench.backends.records import CallRecord
from bench.sim.errors import ProbeUnsaturated


def call(
    name: str, sent: float, deltas: list[tuple[float, int]], finished: float | None
) -> CallRecord:
    return CallRecord("j", name, 10, sent, tuple(deltas), finished)


def test_spans_are_where_the_open_calls_fill_the_slots() -> None:
    calls = [
        call("a", 0.0, [], 4.0),
        call("b", 1.0, [], 3.0),
        call("c", 2.0, [], None),  # cut by the probe's end
    ]
    assert saturated_spans(calls, 2, end=6.0) == [(1.0, 4.0)]
    assert saturated_spans(calls, 3, end=6.0) == [(2.0, 3.0)]
    assert saturated_spans(calls, 4, end=6.0) == []


def test_capacity_counts_the_kv_time_of_the_tokens_streamed_while_saturated() -> None:
    # two calls of a 10-token prompt, both open over [0, 3]; a token every 0.5 s after the first
    a = call("a", 0.0, [(1.0, 1), (1.5, 1), (2.0, 2)], 3.0)
    b = call("b", 0.0, [(1.0, 1), (1.5, 1)], 3.0)
    capacity = measure_capacity([a, b], slots=2, end=3.0)
    work = (11 + 12 + 13 + 14) + (11 + 12)  # token i of a 10-token prompt costs 10 + i
    assert capacity.saturated_s == 3.0
    assert capacity.saturated_work == work
    # gaps after the first token: a 0.5 (1 token) + 0.5 (2 tokens), b 0.5 (1 token)
    assert capacity.step_seconds == pytest.approx(1.5 / 4)
    assert capacity.capacity == pytest.approx(work / 3.0 * 1.5 / 4)
    assert capacity.work_per_s == pytest.approx(work / 3.0)


def test_a_probe_that_never_fills_the_slots_is_refused() -> None:
    with pytest.raises(ProbeUnsaturated):
        measure_capacity([call("a", 0.0, [(1.0, 1), (2.0, 1)], 2.0)], slots=2, end=2.0)
