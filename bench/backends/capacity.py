"""The server's capacity as the GPS reference takes it, measured from a saturated direct run.

Probe (as the study's, `bench.sim.setup.prepare`, on the real server): the workload's jobs all
arrive at once and are sent direct until half their KV token-time has streamed. The server is
saturated while the calls sent and not finished fill its batch slots. Over those stretches,
`work_per_s` is the KV token-time the streamed tokens stand for per second (token `i` of a call
with prompt `p` counts `p + i`, as `kv_token_time` charges it), and `step_seconds` the mean time
between a call's streamed tokens (its decode step), the gaps before a call's first token left
out (queueing and prefill). The GPS reference then offers `capacity = work_per_s * step_seconds`
token-slots per step of `step_seconds`: a call alone takes one step a token, and all together
are served at the measured rate. Pure: records in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.backends.records import CallRecord
from bench.sim.errors import ProbeUnsaturated
from tenants.policies import kv_token_time


@dataclass(frozen=True, slots=True)
class Capacity:
    capacity: float  # KV token-slots per step
    step_seconds: float  # mean decode step while saturated
    saturated_s: float  # time the probe spent saturated
    saturated_work: float  # KV token-time streamed meanwhile

    @property
    def work_per_s(self) -> float:
        return self.saturated_work / self.saturated_s


def saturated_spans(
    calls: Sequence[CallRecord], slots: int, end: float
) -> list[tuple[float, float]]:
    """The stretches of time (start, end) with at least `slots` calls sent and not finished."""
    events = sorted(
        [(c.sent, 1) for c in calls]
        + [(c.finished if c.finished is not None else end, -1) for c in calls],
        key=lambda e: (e[0], e[1]),  # a finish before a send at the same instant
    )
    spans: list[tuple[float, float]] = []
    open_calls, since = 0, 0.0
    for time, change in events:
        before = open_calls
        open_calls += change
        if before < slots <= open_calls:
            since = time
        elif open_calls < slots <= before and time > since:
            spans.append((since, time))
    return spans


def _inside(spans: Sequence[tuple[float, float]], time: float) -> bool:
    return any(start < time <= end for start, end in spans)


def measure_capacity(calls: Sequence[CallRecord], slots: int, end: float) -> Capacity:
    """The capacity the probe's `calls` show; ProbeUnsaturated when they never filled the slots."""
    spans = saturated_spans(calls, slots, end)
    seconds = sum(e - s for s, e in spans)
    work = gaps = 0.0
    tokens = 0
    for call in calls:
        streamed, previous = 0, None
        for time, count in call.deltas:
            if _inside(spans, time):
                work += kv_token_time(call.prompt_tokens, streamed + count)
                work -= kv_token_time(call.prompt_tokens, streamed)
                if previous is not None:
                    gaps += time - previous
                    tokens += count
            streamed += count
            previous = time
    if seconds <= 0 or tokens == 0:
        raise ProbeUnsaturated(f"the probe never had {slots} calls running: too few jobs")
    step = gaps / tokens
    return Capacity(work / seconds * step, step, seconds, work)
