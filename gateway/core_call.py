"""What a dispatch core holds and answers: a call with its caller's payload, and decisions.

`CoreCall` is one ready, taken or running call of the core (`gateway.dispatch_core`) with the
state its attempts carry; `Dispatch` and `Reprioritize` are the decisions the caller performs.
Plain data: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from tenants.policies import ReadyCall

T = TypeVar("T")
# the batch past which the policy lets only its most urgent jobs add calls: a number per
# backend, "auto" for each backend's own measure of it (`BackendCapacity.knee_calls`), or none
Knee = int | Literal["auto"] | None
# a ready call planned again: its new call and output reserve, or None where nothing changed
Replanner = Callable[["CoreCall[T]"], tuple[ReadyCall, int] | None]


@dataclass(slots=True)
class CoreCall(Generic[T]):
    """A call the core holds, with what its caller keeps beside it (`payload`)."""

    call: ReadyCall
    reserve_output: int  # KV set aside for its output on the backend
    payload: T
    reserved: bool = False  # its quota needs no reserve step (done with its job, or none)
    backend: str = ""  # where it runs or is being sent
    priority: float = 0.0  # what its backend was last told
    attempts: int = 0  # dispatches so far
    lost_on: str = ""  # the backend its last attempt was lost with: the next runs elsewhere
    sheddable: bool = False  # its job gives way to others (negative priority)
    yields: int = 0  # attempts it gave up for a waiting call (not counted as lost)
    yielding: bool = False  # chosen to yield: being aborted
    yields_to: str = ""  # the call it yields its share to: it waits until that one is sent
    granted: float = 0.0  # its attempt's charge in the pool's share (per unit of weight)
    key: float = 0.0  # where its grant put it in the pool's order: its priority once sent
    produced: int = 0  # output tokens its attempt has streamed so far
    # until when its tenant's own quota held it back, as of when it last left the ready calls:
    # its wait for the gateway began no sooner (`CallBook.waiting_since`)
    quota_hold: float = -math.inf

    @property
    def kv_tokens(self) -> int:
        return self.call.prompt_tokens + self.reserve_output


@dataclass(frozen=True, slots=True)
class Dispatch(Generic[T]):
    """Send this call to `entry.backend`; first ask the pool's share for it when `needs_grant`
    and reserve its quota when `needs_reserve` (either: it is taken, `launched` next)."""

    entry: CoreCall[T]
    needs_reserve: bool
    needs_grant: bool = False

    @property
    def taken(self) -> bool:
        return self.needs_reserve or self.needs_grant


@dataclass(frozen=True, slots=True)
class Reprioritize(Generic[T]):
    """Tell the backend holding this call its new priority."""

    entry: CoreCall[T]
    priority: float
