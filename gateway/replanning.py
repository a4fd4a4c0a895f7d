"""Plans that change after a call was planned: the dispatcher's side of the predictor's feedback.

A call planned for refinement is predicted again from its prompt's hidden state once prefilled
(its backend's reservation and its job's key follow). A kind of call that the error tracker turns
conservative (`CallPlanner.overran`, `CallPlanner.observe`) has its tenant's ready calls of that
kind planned again as they would be now (`CallPlanner.widen`), a job at a time in a task of its
own so that a large backlog does not hold the loop; a call that comes back to ready (refused,
made to wait, set aside, run again) is planned again alone. Each re-key tells the backends that
take priorities the new ones.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import anyio.lowlevel
from opentelemetry import trace

from gateway.calls import CallPlanner
from gateway.core_call import CoreCall, Reprioritize
from gateway.lanes import Lane
from gateway.tickets import Ticket
from tenants.policies import ReadyCall

log = logging.getLogger(__name__)
Entry = CoreCall[Ticket]


class Replanning:
    def __init__(
        self,
        lanes: Mapping[str, Lane],
        planner: CallPlanner,
        clock: Callable[[], float],
        start_soon: Callable[..., None],  # starts a task beside the loop's
    ) -> None:
        self._lanes = lanes
        self._planner = planner
        self._clock = clock
        self._start_soon = start_soon

    def reprioritize(self, changes: list[Reprioritize[Ticket]]) -> None:
        """Tell the backends the new priority of the calls they hold, after a re-key."""
        for change in changes:
            backend = self._lanes[change.entry.payload.model_name].backends[change.entry.backend]
            if backend.capabilities.priority:
                backend.set_priority(change.entry.call.call_id, change.priority)

    def widen_kind(self, ticket: Ticket) -> None:
        """The ticket's kind of call turned conservative: its tenant's ready calls of that kind
        (in its pool), planned before, are planned as they would be now and the policy re-keys
        their jobs (`_widen_backlog`). Running calls keep their reservations."""
        self._start_soon(self._widen_backlog, self._lanes[ticket.model_name], ticket.call.tenant_id)

    async def _widen_backlog(self, lane: Lane, tenant_id: str) -> None:
        """The tenant's ready calls in the lane planned again a job at a time, with a checkpoint
        after each: a backlog may hold 65,536 calls (about a second of planning), and planned in
        one go it would hold every other tenant's streams, dispatches and RPCs that long. A job
        whose calls are sent or gone meanwhile has nothing left to plan; one that a failure
        stops planning keeps its plans (logged), not the loop's other work."""
        try:
            for job_id in list(lane.core.ready.jobs(tenant_id)):
                self.reprioritize(lane.core.replan_job(job_id, self._widened, self._clock()))
                await anyio.lowlevel.checkpoint()
        except Exception:
            log.exception("planning %s's ready calls again", tenant_id)

    def widen_call(self, ticket: Ticket) -> None:
        """The ticket is ready again (its kind may have turned conservative while it ran, or
        while it was being taken: refused by a quota or the share, or set aside unsent): it
        alone is planned as `widen_kind` would, not with a scan of its tenant's backlog."""
        core = self._lanes[ticket.model_name].core
        self.reprioritize(core.replan_call(ticket.call.call_id, self._widened, self._clock()))

    def _widened(self, entry: Entry) -> tuple[ReadyCall, int] | None:
        """A ready call's new call and output reserve, if its plan was widened (`widen`)."""
        ticket = entry.payload
        return (ticket.call, ticket.plan.reserve_output) if self.widen(ticket) else None

    def widen(self, ticket: Ticket) -> bool:
        """A waiting ticket planned before its kind turned conservative takes the plan it would
        get now (`CallPlanner.widen`); whether it did."""
        plan = self._planner.widen(ticket.plan)
        if plan is not None:
            ticket.replan(plan)
        return plan is not None

    def refine(self, entry: Entry, hidden: list[float]) -> None:
        """The call is prefilled: predict its output again from its hidden state; the backend
        moves its KV reservation and the policy re-keys its job (an event on the call's span)."""
        ticket = entry.payload
        before = ticket.plan
        call = ticket.replan(self._planner.refine(before, hidden))
        trace.get_current_span().add_event(
            "fairgate.prediction.refined",
            {
                "fairgate.predicted_output_tokens.before": before.policy_output,
                "fairgate.predicted_output_tokens": ticket.plan.policy_output,
                "fairgate.reserved_output_tokens": ticket.plan.reserve_output,
            },
        )
        lane = self._lanes[ticket.model_name]
        lane.backends[entry.backend].set_prediction(call.call_id, ticket.plan.reserve_output)
        self.reprioritize(
            lane.core.refined(call.call_id, call, ticket.plan.reserve_output, self._clock())
        )
