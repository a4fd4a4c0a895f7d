"""What the dispatch core needs of anything that runs calls: room, a token stream, an abort.

A backend is the in-process engine (`local`) or a vLLM-compatible server over HTTP (`openai`).
`capacity()` is one snapshot of its room as the backend knows it now, already counting the calls
the gateway sent it that it has not reported yet (a remote backend's metrics lag its requests),
so the dispatch core only has to take off the calls it is about to send. `submit` starts a call
and returns its stream of token deltas; closing the stream early aborts the call. A stream that
breaks because the backend failed (a dropped connection, a dead server) raises `BackendLost`:
the call is lost, not failed, and the gateway may run it again elsewhere.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine import SamplingParams, TokenDelta
from gateway.backends.errors import BackendLost

__all__ = [
    "Backend",
    "BackendCall",
    "BackendCapacity",
    "BackendLost",
    "CallStream",
    "CallUsage",
    "Capabilities",
    "blocks",
]


def blocks(num_tokens: int, block_size: int) -> int:
    """The KV blocks `num_tokens` tokens take."""
    return -(-num_tokens // block_size)


@dataclass(frozen=True, slots=True)
class BackendCapacity:
    """A backend's room now, what it holds and what it was sent included."""

    free_blocks: int  # KV blocks left once every call it holds or was sent is admitted
    block_size: int  # tokens per KV block
    free_slots: int  # batch slots left
    running: int  # calls it is running
    waiting: int  # calls it holds but has not admitted
    healthy: bool  # False: send it nothing (down, circuit open, metrics stale)
    total_blocks: int = 0  # its whole KV pool, for usage gauges; 0: unknown
    # the batch past which its throughput grows little (engine.step_fit), as measured from its
    # own steps; None: not measured
    knee_calls: int | None = None

    def blocks_for(self, num_tokens: int) -> int:
        return blocks(num_tokens, self.block_size)

    @property
    def free_kv_tokens(self) -> int:
        return self.free_blocks * self.block_size

    @property
    def kv_usage(self) -> float | None:
        """The share of its KV blocks in use, in [0, 1] (what it was sent but has not admitted
        counts, and may pass its pool); None when its pool's size is unknown."""
        if not self.total_blocks:
            return None
        return min(max((self.total_blocks - self.free_blocks) / self.total_blocks, 0.0), 1.0)


@dataclass(frozen=True, slots=True)
class Capabilities:
    hidden_states: bool  # hands out a prompt's hidden state once prefilled (refinement)
    priority: bool  # orders and preempts its calls by the priority the gateway gives
    # other gateway replicas may send it calls too (a server), so its pool's fair share is
    # kept across them (gateway/share.py); False for an engine inside this process
    shared: bool = False


@dataclass(frozen=True, slots=True)
class BackendCall:
    """One call as a backend receives it: token ids in, the gateway's limits applied."""

    call_id: str  # the call's id with the backend: abort and priority name it
    prompt_ids: Sequence[int]
    params: SamplingParams  # max_tokens is the gateway's enforced cap
    priority: float = 0.0  # lower runs first; only for backends with the capability
    predicted_output: int = 0  # KV the backend should set aside for the output, when it can
    cache_salt: str = ""  # prefix-cache blocks are shared only between equal salts
    # this attempt's request id on a server (empty: the call id): a call run again is a new
    # request there, which a server still finishing the last attempt's (it has not yet seen
    # its client go) would refuse under the same id
    attempt_id: str = ""


@dataclass(frozen=True, slots=True)
class CallUsage:
    """What a call used, as the quota settles it."""

    prompt_tokens: int
    completion_tokens: int  # the backend's own count when it reported one, else the tokens seen
    reported: bool  # True: the backend reported it; False: counted from the stream


class CallStream(Protocol):
    """A call's token deltas; the last has `finished` True. `aclose` before then aborts.

    `usage` is set when the last delta is handed out, or when the stream breaks: the backend's
    reported usage when it gave one, else the tokens streamed so far. The quota settles it.
    """

    def __aiter__(self) -> AsyncIterator[TokenDelta]: ...

    @property
    def usage(self) -> CallUsage | None: ...

    async def aclose(self) -> None: ...


class Backend(Protocol):
    name: str  # unique in its pool, for routing, metrics and logs
    model: str  # the served model id calls are sent for
    capabilities: Capabilities

    def capacity(self) -> BackendCapacity: ...

    def down_for(self) -> float | None:
        """How long it has not served (None: it serves); a pool down long enough refuses new
        jobs."""
        ...

    def submit(self, call: BackendCall) -> CallStream:
        """Start the call; raises ValueError-like errors for a call it can never run."""
        ...

    def abort(self, call_id: str) -> None: ...

    def set_priority(self, call_id: str, priority: float) -> None: ...

    def set_prediction(self, call_id: str, predicted_output: int) -> None: ...
