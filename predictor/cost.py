"""The cost of a call and of a job in KV token-time, and the plain billing counters.

A call with a prompt of `p` tokens that generates `d` tokens holds KV for `p + i` tokens at
decode step `i`, so it costs `c(p, d) = p*d + d*(d+1)/2` token-steps. A job costs the sum over
its nodes. A node that has not run yet does not know its prompt length: its prompt is its own
template plus the outputs of the parents it splices in, so its predicted prompt length adds
those parents' output lengths (actual for finished parents, predicted otherwise), in
topological order. Invariant: costs are non-negative and a finished node's cost uses only its
actual counts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from predictor.errors import InvalidCall, JobGraphInvalid


def kv_token_time(prompt_tokens: float, output_tokens: float) -> float:
    """Token-steps of KV held by a call: `p*d + d*(d+1)/2`."""
    if prompt_tokens < 0 or output_tokens < 0:
        raise InvalidCall(f"token counts must be >= 0, got p={prompt_tokens} d={output_tokens}")
    return prompt_tokens * output_tokens + output_tokens * (output_tokens + 1) / 2


@dataclass(frozen=True, slots=True)
class TokenCounters:
    """Plain counters for billing and token quotas."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def vtc_units(self, input_weight: float = 1.0, output_weight: float = 2.0) -> float:
        """VTC's service units (Sheng et al., OSDI'24): `w_p*p + w_q*d`, default `p + 2d`."""
        return input_weight * self.input_tokens + output_weight * self.output_tokens

    def __add__(self, other: TokenCounters) -> TokenCounters:
        return TokenCounters(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens
        )


@dataclass(frozen=True, slots=True)
class CostNode:
    """One node of a job as the cost model sees it."""

    name: str
    template_tokens: int  # prompt tokens of the node's own text, before parents' outputs
    output_tokens: float  # actual when finished, else the predicted length (a point estimate)
    spliced_parents: tuple[str, ...] = ()  # parents whose outputs are pasted into the prompt
    prompt_tokens: int | None = None  # the rendered prompt's length, once known
    finished: bool = False


@dataclass(frozen=True, slots=True)
class NodeCost:
    name: str
    prompt_tokens: float  # actual or predicted (template + spliced parents' outputs)
    output_tokens: float
    kv_token_time: float
    finished: bool


@dataclass(frozen=True, slots=True)
class JobCost:
    nodes: tuple[NodeCost, ...]  # in topological order

    @property
    def total(self) -> float:
        return sum(n.kv_token_time for n in self.nodes)

    @property
    def remaining(self) -> float:
        """KV token-time of the nodes that have not finished."""
        return sum(n.kv_token_time for n in self.nodes if not n.finished)

    @property
    def by_name(self) -> dict[str, NodeCost]:
        return {n.name: n for n in self.nodes}


def job_cost(nodes: Sequence[CostNode]) -> JobCost:
    """Cost every node, propagating output lengths into children's predicted prompts."""
    by_name = {n.name: n for n in nodes}
    if len(by_name) != len(nodes):
        raise JobGraphInvalid("duplicate node names")
    costs: dict[str, NodeCost] = {}
    for node in _topological(nodes, by_name):
        if node.prompt_tokens is not None:
            prompt: float = node.prompt_tokens
        else:
            prompt = node.template_tokens + sum(
                costs[p].output_tokens for p in node.spliced_parents
            )
        costs[node.name] = NodeCost(
            node.name,
            prompt,
            node.output_tokens,
            kv_token_time(prompt, node.output_tokens),
            node.finished,
        )
    return JobCost(tuple(costs.values()))


def _topological(nodes: Sequence[CostNode], by_name: dict[str, CostNode]) -> list[CostNode]:
    for node in nodes:
        for parent in node.spliced_parents:
            if parent not in by_name:
                raise JobGraphInvalid(f"node {node.name!r} splices unknown parent {parent!r}")
    indegree = {n.name: len(set(n.spliced_parents)) for n in nodes}
    children: dict[str, list[str]] = {n.name: [] for n in nodes}
    for node in nodes:
        for parent in set(node.spliced_parents):
            children[parent].append(node.name)
    ready = deque(n.name for n in nodes if indegree[n.name] == 0)
    order: list[CostNode] = []
    while ready:
        name = ready.popleft()
        order.append(by_name[name])
        for child in children[name]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if len(order) != len(nodes):
        raise JobGraphInvalid("the job's nodes form a cycle")
    return order
