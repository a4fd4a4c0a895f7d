"""Predictions through the gateway's own `CallPlanner`, for simulations that test what it learns.

`PlannerPredictor` is the simulation's `CallPredictor` over a `CallPlanner` (`gateway/calls.py`):
a ready call is planned, a running one checked against its p90 and a finished one observed, and
ready calls are planned again once their kind turns conservative, as the dispatcher does, so the
planner's history, residual correction and `ErrorTracker` (conservative mode, widening) act in
the simulation as in the gateway. `table_planner` builds
the gateway's stack around a fixed table of predictions: the table stands in for the prompt
model (`TableModel`, a point prediction per call, found by the call's id passed as its prompt
text), corrected online per tenant and node by the history predictor and judged by the tracker.
Invariant: a call's plan is observed once, when it finishes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from bench.sim.predictions import CallEstimate
from bench.workloads.format import Job, Node
from gateway.calls import CallDefaults, CallPlan, CallPlanner
from gateway.jobs.model import NodeSpec, SamplingSpec
from gateway.server import LENGTH_PRIOR
from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from predictor.error_tracker import ErrorTracker
from predictor.history import HistoryPredictor
from tenants import TenantQuota


@dataclass(slots=True)
class PlanLog:
    """What the planner did, by job kind."""

    conservative: Counter[str] = field(default_factory=Counter)  # planned in conservative mode
    finished: Counter[str] = field(default_factory=Counter)
    first_conservative: dict[str, float] = field(default_factory=dict)  # kind -> when
    finished_before: dict[str, int] = field(default_factory=dict)  # kind -> calls done by then


class PlannerPredictor:
    """A node's arrival estimate is the planner's `expected_output` (as in
    `gateway.tickets.node_costs`: the predicted mean, or its conservative length);
    a ready call is planned (again when its kind turns conservative), a running one checked
    against its p90 and a finished one observed, as the dispatcher does."""

    def __init__(self, planner: CallPlanner, context: int) -> None:
        self.planner = planner
        self.quota = TenantQuota(
            max_prompt_tokens=0, max_tokens_ceiling=context, default_max_tokens=context
        )
        self.plans: dict[tuple[str, str], CallPlan] = {}
        self.overran: set[tuple[str, str]] = set()  # running calls the tracker counted
        self.log = PlanLog()

    def estimate(self, job: Job, node: Node) -> float:
        return self.planner.expected_output(features(job, node))

    def plan(self, job: Job, node: Node, now: float) -> CallEstimate:
        spec = NodeSpec(node.node_id, "", sampling=SamplingSpec(node.max_tokens), name=node.node_id)
        text = call_text(job, node)
        plan = self.planner.plan(job.tenant, spec, text, node.prompt_tokens, self.quota)
        assert plan.params.max_tokens == node.max_tokens, "the quota and context cap nothing"
        return self._planned(job, node, plan, now)

    def replan(self, job: Job, node: Node, now: float) -> CallEstimate | None:
        """A ready call's plan widened, once its kind has turned conservative."""
        plan = self.planner.widen(self.plans[job.job_id, node.node_id])
        return None if plan is None else self._planned(job, node, plan, now)

    def progressed(self, job: Job, node: Node, produced: int, now: float) -> bool:
        key = job.job_id, node.node_id
        plan = self.plans[key]
        if key in self.overran or not plan.past_p90(produced):
            return False
        self.overran.add(key)
        return self.planner.overran(plan, produced)

    def observe(self, job: Job, node: Node, produced: int, now: float) -> bool:
        key = job.job_id, node.node_id
        turned = self.planner.observe(self.plans.pop(key), produced, key in self.overran)
        self.overran.discard(key)
        self.log.finished[job.kind] += 1
        return turned

    def _planned(self, job: Job, node: Node, plan: CallPlan, now: float) -> CallEstimate:
        self.plans[job.job_id, node.node_id] = plan
        if plan.conservative:
            self.log.conservative[job.kind] += 1
            if job.kind not in self.log.first_conservative:
                self.log.first_conservative[job.kind] = now
                self.log.finished_before[job.kind] = self.log.finished[job.kind]
        return CallEstimate(plan.policy_output, plan.reserve_output)


def call_text(job: Job, node: Node) -> str:
    """The call's stand-in prompt text: its id (the simulation has no text)."""
    return _text(job.job_id, node.node_id)


def _text(job_id: str, node_id: str) -> str:
    return f"{job_id}\x00{node_id}"


def features(job: Job, node: Node) -> CallFeatures:
    """The call as `CallPlanner.plan` shows it to the predictor."""
    return CallFeatures(
        job.tenant, node.node_id, node.prompt_tokens, node.max_tokens, call_text(job, node)
    )


class TableModel:
    """A static prompt model that knows each call's prediction from a table."""

    def __init__(self, table: Mapping[tuple[str, str], float]) -> None:
        self.table = {_text(job, node): value for (job, node), value in table.items()}

    def predict(self, call: CallFeatures) -> LengthDistribution:
        return LengthDistribution.point(min(self.table[call.prompt_text], call.max_tokens))

    def observe(self, call: CallFeatures, true_len: int) -> None:
        pass


def table_planner(table: Mapping[tuple[str, str], float], context: int) -> PlannerPredictor:
    """The gateway's planner stack (history with residual correction, error tracker; no guard
    and no refiner) over `table` as its prompt model."""
    history = HistoryPredictor(LENGTH_PRIOR, cold=TableModel(table))
    defaults = CallDefaults(max_model_len=context)
    return PlannerPredictor(CallPlanner(history, None, defaults, None, ErrorTracker()), context)
