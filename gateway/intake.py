"""How a job's nodes become calls: encoded for the pool each runs in, costed, planned.

When a job arrives its blank prompts (its inputs rendered, no parent outputs yet) are encoded
for the model each node runs on, its costs on arrival make up what the policy is told of it
(`JobInfo`) and its roots' calls are planned before its admission; a node whose parents are
done is rendered with their outputs and encoded then (`encode_node`), its rendered size checked
against the bound before any of it is rendered. Encoding runs on the event loop for one short
prompt (handing it to a worker thread and back costs the loop more), else in a worker thread,
one of the tenant's at a time, on a thread of its own rather than one of the default workers:
no tenant's encoding waits for another's. Costing and planning stay on the event loop (the
predictor's history changes there as calls end) and yield to it every few nodes (`paced`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.lowlevel

from gateway.calls import CallPlanner, CallRefused
from gateway.job_run import JobRun
from gateway.jobs import input_sizes, oversized_prompt, rendered_chars
from gateway.keyed_locks import KeyedLocks
from gateway.lanes import Lane
from gateway.prompts import PromptRefused
from gateway.tickets import Blank, Ticket, job_info, node_costs
from tenants import TenantQuota
from tenants.policies import JobInfo

Args = TypeVarTuple("Args")
Encoded = TypeVar("Encoded")
T = TypeVar("T")
# a prompt this short is encoded on the event loop (~0.1-0.2 ms with the chat template), for
# less than handing it to a worker thread and back costs the loop
INLINE_ENCODE_CHARS = 512
# a job's arrival costs and its roots' plans yield to the loop this often (~0.25 ms a node)
NODES_PER_CHECKPOINT = 8
Planned = Ticket | CallRefused  # a ready node's call, or why the planner refused it


@dataclass(slots=True)
class Admitted:
    """A job the store has admitted: its costs for the policy, its roots' calls (planned
    before its admission) and the one of them a one-call job reserved with it (held or not)."""

    info: JobInfo
    roots: dict[str, Planned]  # root -> its call; a refused one fails once the job is submitted
    ticket: Ticket | None = None  # one of `roots`: the store was asked to reserve it


class Intake:
    def __init__(self, lanes: Mapping[str, Lane], default_model: str, planner: CallPlanner) -> None:
        self._lanes = lanes
        self._default_model = default_model
        self._planner = planner
        self._tokenizing = KeyedLocks()  # one tokenizing worker per tenant

    def lane_of(self, run: JobRun, node_id: str) -> Lane:
        """The pool a node runs in: the model it names, else the default."""
        return self._lanes[run.nodes[node_id].spec.model or self._default_model]

    def lanes_of(self, run: JobRun) -> list[Lane]:
        """The pools the job's nodes run in, each once."""
        models = {run.nodes[n].spec.model or self._default_model for n in run.nodes}
        return [self._lanes[model] for model in sorted(models)]

    async def blanks(self, run: JobRun) -> dict[str, Blank]:
        """Every node's blank prompt, encoded for the model it runs on."""
        return await self.tokenize(run.tenant_id, small_blanks(run), self._encode_blanks, run)

    async def job_info(
        self, run: JobRun, quota: TenantQuota, now: float, blanks: dict[str, Blank]
    ) -> JobInfo:
        """The job's costs on arrival, yielding to the event loop every few nodes (`paced`)."""
        models = {node_id: self.lane_of(run, node_id).model for node_id in run.nodes}
        costs = node_costs(run, quota, blanks, self._planner, models)
        return job_info(run, quota, now, await paced(costs))

    async def plan_roots(
        self, run: JobRun, roots: Sequence[str], quota: TenantQuota, blanks: dict[str, Blank]
    ) -> dict[str, Planned]:
        """The roots' calls, yielding to the event loop every few (`paced`): planned with the
        job's costs, before its admission, so that adding the job plans nothing. A plan leaves
        the planner nothing that costing the job has not (the error tracker's kind of call,
        `tracker_key`): an admission refused or undone after it leaves no trace of them."""
        planned = (self.plan(run, node_id, quota, blanks[node_id]) for node_id in roots)
        return dict(zip(roots, await paced(planned), strict=True))

    def plan(self, run: JobRun, node_id: str, quota: TenantQuota, encoded: Blank) -> Planned:
        """A ready node's call, or the planner's refusal (its node fails as it is added)."""
        try:
            return self.lane_of(run, node_id).tickets.make(run, node_id, quota, encoded)
        except CallRefused as exc:
            return exc

    def ticket_to_hold(self, run: JobRun, roots: dict[str, Planned]) -> Ticket | None:
        """The ticket of a one-call job that the next dispatch pass will start whatever the
        policy's order: some backend, below its knee, has room for it and every ready call."""
        if len(run.nodes) != 1:
            return None
        (ticket,) = roots.values()
        if isinstance(ticket, CallRefused):
            return None  # its node fails once submitted
        lane = self._lanes[ticket.model_name]
        reserve, rooms = ticket.plan.reserve_output, lane.capacities()
        starts = lane.core.starts_at_once(ticket.call, reserve, rooms, run.spec.sheddable)
        return ticket if starts else None

    def outputs_chars(self, run: JobRun, node_id: str) -> int:
        """What its ancestors' outputs add to the node's rendered prompt."""
        spec, inputs = run.nodes[node_id].spec, input_sizes(run.spec.inputs)
        return rendered_chars(spec, inputs, _output_sizes(run, node_id)) - rendered_chars(
            spec, inputs, {}
        )

    async def encode_node(self, run: JobRun, node_id: str, max_prompt_chars: int) -> Blank:
        """A node whose parents are done, rendered with their outputs and encoded; CallRefused
        when its prompt would pass `max_prompt_chars`, before any of it is rendered, or when
        the model's chat template refuses it."""
        outputs = _output_sizes(run, node_id)
        size = rendered_chars(run.nodes[node_id].spec, input_sizes(run.spec.inputs), outputs)
        problem = oversized_prompt(size, max_prompt_chars)
        if problem is not None:
            raise CallRefused(f"the prompt {problem}")
        encode = self.lane_of(run, node_id).tickets.encode_node
        small = size <= INLINE_ENCODE_CHARS
        try:
            return await self.tokenize(run.tenant_id, small, encode, run, node_id)
        except PromptRefused as exc:  # its parents' outputs may hold what the template refuses
            raise CallRefused(f"the model's chat template refuses the prompt: {exc}") from None

    def _encode_blanks(self, run: JobRun) -> dict[str, Blank]:
        blanks: dict[str, Blank] = {}
        for lane in self.lanes_of(run):
            mine = [n for n in run.dag.order if self.lane_of(run, n) is lane]
            blanks |= lane.tickets.encode_blanks(run, mine)
        return blanks

    async def tokenize(
        self,
        tenant_id: str,
        small: bool,
        encode: Callable[[Unpack[Args]], Encoded],
        *args: *Args,
    ) -> Encoded:
        """`encode(*args)`: on the event loop when `small` (one prompt of at most
        INLINE_ENCODE_CHARS), else in a worker thread, one of the tenant's at a time, on a
        thread of its own rather than one of the default workers: no tenant's encoding waits
        for another's."""
        if small:
            return encode(*args)
        async with self._tokenizing.hold(tenant_id):
            limiter = anyio.CapacityLimiter(1)
            return await anyio.to_thread.run_sync(encode, *args, limiter=limiter)


def small_blanks(run: JobRun) -> bool:
    """A job of one node whose blank prompt is short: encoded on the event loop."""
    if len(run.nodes) != 1:
        return False
    (node,) = run.nodes.values()
    return rendered_chars(node.spec, input_sizes(run.spec.inputs), {}) <= INLINE_ENCODE_CHARS


async def paced(items: Iterable[T]) -> list[T]:
    """All of `items`, yielding to the event loop every NODES_PER_CHECKPOINT of them: drawing
    one may be a node's prediction or its plan (a prompt model's pass, ~0.25 ms), and all of a
    tenant's largest job drawn in one go would hold every other tenant's streams, dispatches
    and RPCs for tens of ms. On the loop, not in a worker thread: the predictor's history
    changes there as calls end."""
    drawn: list[T] = []
    for item in items:
        drawn.append(item)
        if len(drawn) % NODES_PER_CHECKPOINT == 0:
            await anyio.lowlevel.checkpoint()
    return drawn


def _output_sizes(run: JobRun, node_id: str) -> dict[str, int]:
    return {a: len(run.nodes[a].output) for a in run.dag.ancestors(node_id)}
