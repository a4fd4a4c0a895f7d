"""Which backend of a pool takes a call: one with room, where the call should finish first.

The candidates are the backends that can admit the call at once (healthy, a free batch slot, KV
blocks for its prompt and reserved output). Each is scored by the call's predicted completion
there: `ttft + tpot * reserved output`, from the backend's time to first token and time per
output token, fitted online as exponential averages of what it streamed (a backend with no
samples yet borrows the pool's mean; with none anywhere the base is one unit for all), stretched
by how full its batch is, `1 + busy / slots`, since a continuous batch slows every call in it as
it fills. Ties go to the backend with the most free slots, then the most free KV, then the name.
Prefix affinity: the backend that ran the job's last call (its prefix cache may hold their
shared prompt) wins while its score is within `affinity_margin` of the best. Pure: no I/O and
no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.backends.base import BackendCapacity
from tenants.policies import ReadyCall

EWMA_ALPHA = 0.2  # weight of the newest sample: about the last ten calls count


@dataclass(slots=True)
class _Speed:
    ttft_s: float
    tpot_s: float


class Router:
    def __init__(self, affinity_margin: float = 0.2) -> None:
        if affinity_margin < 0:
            raise ValueError("affinity_margin must be >= 0")
        self.affinity_margin = affinity_margin
        self._speed: dict[str, _Speed] = {}
        self._affinity: dict[str, str] = {}  # active job id -> backend that ran its last call

    def route(
        self, call: ReadyCall, kv_tokens: int, rooms: Mapping[str, BackendCapacity]
    ) -> str | None:
        """The backend to send the call to, or None when none can admit it now."""
        fits = [
            name
            for name, room in rooms.items()
            if room.healthy
            and room.free_slots > 0
            and room.free_blocks >= room.blocks_for(kv_tokens)
        ]
        if len(fits) <= 1:
            return fits[0] if fits else None
        output = kv_tokens - call.prompt_tokens
        scores = {name: self._predicted_s(name, output) * _stretch(rooms[name]) for name in fits}
        best = min(fits, key=lambda n: (scores[n], -rooms[n].free_slots, -rooms[n].free_blocks, n))
        near = self._affinity.get(call.job_id)
        if near in scores and scores[near] <= scores[best] * (1 + self.affinity_margin):
            return near
        return best

    def sent(self, call: ReadyCall, backend: str) -> None:
        self._affinity[call.job_id] = backend

    def forget(self, job_id: str) -> None:
        self._affinity.pop(job_id, None)

    def observe(self, backend: str, ttft_s: float, tpot_s: float) -> None:
        """A call on `backend` streamed its first token after `ttft_s`, then one per `tpot_s`."""
        speed = self._speed.get(backend)
        if speed is None:
            self._speed[backend] = _Speed(ttft_s, tpot_s)
            return
        speed.ttft_s += EWMA_ALPHA * (ttft_s - speed.ttft_s)
        speed.tpot_s += EWMA_ALPHA * (tpot_s - speed.tpot_s)

    def _predicted_s(self, backend: str, output_tokens: int) -> float:
        speed = self._speed.get(backend) or self._pool_mean()
        return 1.0 if speed is None else speed.ttft_s + speed.tpot_s * output_tokens

    def _pool_mean(self) -> _Speed | None:
        if not self._speed:
            return None
        n = len(self._speed)
        return _Speed(
            sum(s.ttft_s for s in self._speed.values()) / n,
            sum(s.tpot_s for s in self._speed.values()) / n,
        )


def _admits(room: BackendCapacity, kv_tokens: int) -> bool:
    """Would the backend admit a call needing `kv_tokens` of KV at once?"""
    return room.healthy and room.free_slots > 0 and room.free_blocks >= room.blocks_for(kv_tokens)


def _stretch(room: BackendCapacity) -> float:
    """How much slower a call runs in the backend's batch as full as it is now."""
    busy = room.running + room.waiting
    return 1.0 + busy / max(busy + room.free_slots, 1)
