"""What a run leaves behind: each job's finish as its client saw it, each direct call's stream,
and the lone calls' times to first token.

Times are seconds after the run's start on the client's monotonic clock (`anyio.current_time`),
the same clock for every arm: a job's JCT is from its arrival offset (when its client sent it)
to when its client saw its last call end. Plain data: no I/O, no live objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tenants.policies import kv_token_time


@dataclass(frozen=True, slots=True)
class CallRecord:
    job_id: str
    node_id: str
    prompt_tokens: int
    sent: float
    deltas: tuple[tuple[float, int], ...]  # (time, tokens) of each streamed delta, in order
    finished: float | None  # None: cut before it finished (the capacity probe stops early)

    @property
    def first_token(self) -> float | None:
        return next((t for t, n in self.deltas if n), None)

    @property
    def output_tokens(self) -> int:
        return sum(n for _, n in self.deltas)

    def work(self) -> float:
        """KV token-time of the tokens it streamed."""
        return kv_token_time(self.prompt_tokens, self.output_tokens)


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    tenant: str
    arrival: float
    finished: float

    @property
    def jct(self) -> float:
        return self.finished - self.arrival


@dataclass(frozen=True, slots=True)
class ArmRun:
    arm: str
    jobs: dict[str, JobRecord]
    calls: Sequence[CallRecord] = ()  # direct runs only
    wrong_lengths: int = 0  # calls whose prompt or output count differs from the plan
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)  # what went unlike the plan, for the report


@dataclass(frozen=True, slots=True)
class LoneCall:
    """One lone call's times to first token, in seconds, sent once each way."""

    direct: float  # straight to the server, as its client saw it
    fairgate: float  # through the gateway, as its client saw it
    # of `fairgate`, the server's part: from the gateway's dispatch to the first chunk reaching
    # the gateway (its HTTP client's work on the request and the first chunk included)
    server: float
