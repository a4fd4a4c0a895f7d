"""Dependency graphs of jobs: parents, children, topological order, cycles, depth and fan-out.

Edges point from a node to the nodes it depends on (its parents). The topological order is the
one every DAG in fairgate uses (`tenants.policies.dag.parents_first`: Kahn's algorithm,
declaration order among nodes that become ready together); when it cannot place every node, an
iterative depth-first search along depends_on names the cycles (one per back edge). Depth is
the longest chain, in nodes, found in topological order. A node's ancestors are its parents' and
those parents, computed once for all nodes in topological order as bit masks (a job of 256 nodes
may have some 30,000 edges: walking them again for each node would cost seconds per job).
Invariant: a built `Dag` is acyclic, every id it mentions is one of its nodes, and `order` lists
each node once, after all of its parents.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gateway.jobs.errors import DagCyclic, DagUnknownNode
from gateway.jobs.model import JobSpec
from tenants.policies.dag import parents_first


@dataclass(frozen=True, slots=True)
class Dag:
    order: tuple[str, ...]  # topological: each node after all of its parents
    parents: Mapping[str, tuple[str, ...]]  # node -> the nodes it depends on
    children: Mapping[str, tuple[str, ...]]  # node -> the nodes that depend on it
    # node -> its ancestors, bit i standing for order[i]
    _ancestor_masks: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bit = {node: 1 << i for i, node in enumerate(self.order)}
        masks: dict[str, int] = {}
        for node in self.order:
            mask = 0
            for parent in self.parents[node]:
                mask |= bit[parent] | masks[parent]
            masks[node] = mask
        object.__setattr__(self, "_ancestor_masks", masks)

    @classmethod
    def build(cls, edges: Mapping[str, Sequence[str]]) -> Dag:
        """Graph from node id -> ids it depends on (repeats ignored), in declaration order.

        Raises DagUnknownNode for a dependency that is not a key, DagCyclic for a cycle.
        """
        parents = {node: tuple(dict.fromkeys(deps)) for node, deps in edges.items()}
        for node, deps in parents.items():
            for parent in deps:
                if parent not in parents:
                    raise DagUnknownNode(node, parent)
        children = _children(parents)
        order = parents_first(parents)
        if len(order) < len(parents):
            raise DagCyclic(find_cycles(parents, 1)[0])
        return cls(order=tuple(order), parents=parents, children=children)

    @classmethod
    def of_job(cls, spec: JobSpec) -> Dag:
        """The job's graph; the spec must have unique node ids (validate it first)."""
        return cls.build({node.id: node.depends_on for node in spec.nodes})

    def roots(self) -> tuple[str, ...]:
        return tuple(node for node in self.order if not self.parents[node])

    def leaves(self) -> tuple[str, ...]:
        return tuple(node for node in self.order if not self.children[node])

    def ancestors(self, node_id: str) -> frozenset[str]:
        """The nodes reachable from `node_id` along depends_on."""
        mask = self._ancestor_masks[node_id]
        return frozenset(node for i, node in enumerate(self.order) if mask >> i & 1)

    def depths(self) -> dict[str, int]:
        """Node -> nodes on the longest chain ending at it (a root has depth 1)."""
        depth: dict[str, int] = {}
        for node in self.order:
            depth[node] = 1 + max((depth[p] for p in self.parents[node]), default=0)
        return depth

    def depth(self) -> int:
        return max(self.depths().values(), default=0)

    def max_fan_out(self) -> int:
        return max((len(kids) for kids in self.children.values()), default=0)


def _children(parents: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    children: dict[str, list[str]] = {node: [] for node in parents}
    for node, deps in parents.items():
        for parent in deps:
            if parent in children:
                children[parent].append(node)
    return {node: tuple(kids) for node, kids in children.items()}


def find_cycles(edges: Mapping[str, Sequence[str]], limit: int) -> list[list[str]]:
    """One cycle per back edge of a depth-first search along depends_on, in declaration order,
    the first `limit` of them (a dense graph of n nodes has n^2 / 2: 32,640 for 256).

    In each cycle every node depends on the next and the last depends on the first, so the
    back edge is `cycle[-1] -> cycle[0]`. Repeated dependencies count once; dependencies that
    are not keys are skipped.
    """
    finished: set[str] = set()
    cycles: list[list[str]] = []
    for root in edges:
        if root in finished:
            continue
        path: list[str] = [root]
        on_path = {root: 0}
        pending = [iter(dict.fromkeys(edges[root]))]
        while pending:
            parent = next(pending[-1], None)
            if parent is None:
                done = path.pop()
                del on_path[done]
                finished.add(done)
                pending.pop()
            elif parent in on_path:
                cycles.append(path[on_path[parent] :])
                if len(cycles) == limit:
                    return cycles
            elif parent in edges and parent not in finished:
                on_path[parent] = len(path)
                path.append(parent)
                pending.append(iter(dict.fromkeys(edges[parent])))
    return cycles
