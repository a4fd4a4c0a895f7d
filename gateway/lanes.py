"""A lane: one pool as the dispatcher drives it, its backends, its fair share and its encoder.

Each pool serves one model, so each has its own dispatch core (a policy of its own: tenants
share each pool's capacity fairly, and a pool with room never waits behind another's queue)
and its own prompt encoder (the model's tokenizer and chat template).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.backends import Backend, BackendCapacity
from gateway.calls import CallPlanner
from gateway.core_call import Knee
from gateway.dispatch_core import DispatchCore
from gateway.tickets import Ticket, Tickets
from tenants.policies import Policy


@dataclass(slots=True)
class Lane:
    model: str
    backends: dict[str, Backend]
    core: DispatchCore[Ticket]
    tickets: Tickets

    def capacities(self) -> dict[str, BackendCapacity]:
        return {name: backend.capacity() for name, backend in self.backends.items()}

    def down_for(self) -> float | None:
        """How long none of its backends has served (None: one serves)."""
        downs = [backend.down_for() for backend in self.backends.values()]
        return None if None in downs else min(d for d in downs if d is not None)


def make_lane(
    model: str,
    backends: Sequence[Backend],
    tokenizer: Any,
    policy: Policy,
    planner: CallPlanner,
    knee_calls: Knee = None,
    share_slots: bool = False,
    gated: bool = False,
    max_model_len: int | None = None,
) -> Lane:
    """`max_model_len`: the pool's own length limit, which no other pool's cuts (None: the
    planner's default)."""
    if not backends or len({b.name for b in backends}) != len(backends):
        raise ValueError(f"pool {model!r} needs at least one backend, each with its own name")
    return Lane(
        model,
        {b.name: b for b in backends},
        DispatchCore(policy, knee_calls, share_slots=share_slots, gated=gated),
        Tickets(tokenizer, planner, model, max_model_len),
    )
