"""From a job's nodes to what the policy and the engine need: predicted costs and tickets.

`job_info` is what the fair-share policy learns when a job arrives: each node's predicted cost
(`node_costs`), where an unrun node's prompt is its template with the inputs filled and its
ancestors' outputs empty (`encode_blanks`), plus its parents' predicted outputs (the roots'
prompts are final, so their token ids are kept). `Tickets.make` turns a ready node into a Ticket:
its rendered and encoded prompt (`encode_node`), its plan (limits, sampling, prediction, anomaly
guard) and the ReadyCall the policy orders. No I/O and no clock: `now` is passed in. The two
encoders are the CPU-heavy part (rendering, the chat template, the tokenizer): they read nothing
that changes while they run, so the dispatcher calls them in a worker thread. The predictions
read the predictor's history, which changes on the event loop as calls end, so they run there,
one node at a time: the dispatcher yields to the loop between nodes.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Any

from gateway.calls import CallPlan, CallPlanner
from gateway.job_run import JobRun
from gateway.jobs.errors import FieldViolation, JobInvalid
from gateway.jobs.template import render_node
from gateway.prompts import Prompt, PromptEncoder, PromptRefused, prompt_text
from predictor.base import CallFeatures
from tenants import TenantQuota
from tenants.policies import JobInfo, NodeCost, ReadyCall

REFUSAL_CHARS = 256  # of a chat template's refusal, quoted to the tenant


@dataclass(frozen=True, slots=True)
class Blank:
    """A node's rendered prompt and its token ids, as int32: a ready call holds them until it
    runs, and a tenant's many ready calls would hold 36 bytes a token as a list of ints."""

    prompt: Prompt
    ids: array[int]


@dataclass(slots=True)
class Ticket:
    """A ready call and everything needed to run it."""

    call: ReadyCall
    run: JobRun
    prompt_ids: array[int]
    plan: CallPlan
    model_name: str
    held: bool = False  # reserved in the quota store with its job's admission
    attempt: int = 1  # a call lost with its backend runs again once (a second attempt)
    overran: bool = False  # ran past its predicted p90; the error tracker has counted it
    fenced_off: bool = False  # this attempt was aborted as its job's lease may have lapsed

    def replan(self, plan: CallPlan) -> ReadyCall:
        """Its plan becomes `plan` (refined, or widened): the call the policy orders follows."""
        self.plan = plan
        self.call = dataclasses.replace(self.call, predicted_output=plan.policy_output)
        return self.call

    @property
    def quota_id(self) -> str:
        """Its reservation's id in the quota store: each attempt reserves and settles its own,
        and so does each attempt of a replica that took the job over (its epoch)."""
        call_id, epoch = self.call.call_id, self.run.epoch
        if epoch > 1:
            return f"{call_id}@{epoch}#{self.attempt}"
        return call_id if self.attempt == 1 else f"{call_id}#{self.attempt}"

    @property
    def quota_tokens(self) -> int:
        """The worst case reserved in the quota store: prompt + enforced max_tokens."""
        return len(self.prompt_ids) + self.plan.params.max_tokens


class Tickets:
    def __init__(
        self,
        tokenizer: Any,
        planner: CallPlanner,
        model_name: str,
        max_model_len: int | None = None,
    ) -> None:
        self.encode = PromptEncoder(tokenizer)
        self.planner = planner
        self.model_name = model_name
        self.max_model_len = max_model_len  # the pool's own limit (None: the planner's)

    def encode_blanks(self, run: JobRun, node_ids: Iterable[str]) -> dict[str, Blank]:
        """The nodes' prompts with their ancestors' outputs empty, rendered and encoded; raises
        JobInvalid naming the first node whose messages the chat template refuses (their roles
        are the tenant's, and known before any parent runs)."""
        blanks = {}
        for node_id in node_ids:
            outputs = dict.fromkeys(run.dag.ancestors(node_id), "")
            prompt = render_node(run.nodes[node_id].spec, run.spec.inputs, outputs)
            try:
                blanks[node_id] = Blank(prompt, array("i", self.encode(prompt)))
            except PromptRefused as exc:
                raise JobInvalid([_refused(run, node_id, exc)]) from None
        return blanks

    def encode_node(self, run: JobRun, node_id: str) -> Blank:
        """A ready node's prompt, rendered from its ancestors' outputs and encoded."""
        prompt = run.prompt(node_id)
        return Blank(prompt, array("i", self.encode(prompt)))

    def make(self, run: JobRun, node_id: str, quota: TenantQuota, encoded: Blank) -> Ticket:
        """The node's call from its encoded prompt; raises CallRefused when it breaks the
        tenant's or the model's limits."""
        spec = run.nodes[node_id].spec
        prompt, prompt_ids = encoded.prompt, encoded.ids
        text, tokens = prompt_text(prompt), len(prompt_ids)
        plan = self.planner.plan(
            run.tenant_id, spec, text, tokens, quota, self.model_name, self.max_model_len
        )
        call = ReadyCall(
            f"{run.job_id}/{node_id}",
            run.job_id,
            run.tenant_id,
            node_id,
            len(prompt_ids),
            plan.policy_output,
            plan.params.max_tokens,
        )
        return Ticket(call, run, prompt_ids, plan, self.model_name)


def _refused(run: JobRun, node_id: str, exc: PromptRefused) -> FieldViolation:
    index = next(i for i, node in enumerate(run.spec.nodes) if node.id == node_id)
    field = "chat.messages" if run.spec.nodes[index].messages is not None else "prompt_template"
    why = str(exc)[:REFUSAL_CHARS]  # the template's text: it travels in a size-capped trailer
    return FieldViolation(f"nodes[{index}].{field}", f"the model's chat template refuses it: {why}")


def node_costs(
    run: JobRun,
    quota: TenantQuota,
    blanks: Mapping[str, Blank],
    planner: CallPlanner,
    model_of: Mapping[str, str],
) -> Iterator[NodeCost]:
    """Each node's predicted cost on its job's arrival, in the DAG's order (`model_of` names the
    model each node runs on, whose history predicts it). One node at a time: a prediction may be
    a prompt model's pass, so a caller on the event loop yields between nodes."""
    predicted: dict[str, float] = {}
    for node_id in run.dag.order:
        spec = run.nodes[node_id].spec
        max_tokens = planner.max_tokens(spec, quota)
        blank = blanks[node_id]
        parents = run.dag.parents[node_id]
        prompt = len(blank.ids) + int(sum(predicted[p] for p in parents))
        features = CallFeatures(
            run.tenant_id,
            spec.name,
            prompt,
            max_tokens,
            prompt_text(blank.prompt),
            model_of[node_id],
        )
        predicted[node_id] = planner.expected_output(features)
        yield NodeCost(node_id, parents, prompt, predicted[node_id], max_tokens)


def job_info(run: JobRun, quota: TenantQuota, now: float, nodes: Iterable[NodeCost]) -> JobInfo:
    """The whole job as the policies see it on arrival, from its nodes' costs (`node_costs`)."""
    return JobInfo(run.job_id, run.tenant_id, quota.weight, now, tuple(nodes), run.spec.priority)


def part_of(info: JobInfo, node_ids: Set[str]) -> JobInfo:
    """The job's nodes that run in one pool, as that pool's policy sees them: a parent in
    another pool is left out (the job run releases the node when all its parents are done)."""
    nodes = tuple(
        dataclasses.replace(n, parents=tuple(p for p in n.parents if p in node_ids))
        for n in info.nodes
        if n.node_id in node_ids
    )
    return dataclasses.replace(info, nodes=nodes)
