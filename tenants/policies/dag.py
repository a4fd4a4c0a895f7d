"""The one topological order of a job's DAG, for the gateway's job model, the policies and the
benchmarks' GPS reference and workloads.

Kahn's algorithm: a node joins the order once all its parents are in it, so the order lists
parents before children, and nodes that become ready together keep their declaration order
(first in, first out). Nodes left out sit on a cycle or below one. It lives here, the lowest
package that both the gateway and the policies may import (docs/ARCHITECTURE.md §1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tenants.policies.errors import InvalidJob


def parents_first(parents: Mapping[str, Sequence[str]]) -> list[str]:
    """Node ids, each after all of its parents; nodes on or below a cycle are left out.

    `parents` maps each node to the nodes it depends on; a repeated parent counts once and a
    parent that is not a key is ignored (callers that care check for those first).
    """
    children: dict[str, list[str]] = {node: [] for node in parents}
    waiting: dict[str, int] = {}
    for node, node_parents in parents.items():
        known = [parent for parent in dict.fromkeys(node_parents) if parent in children]
        waiting[node] = len(known)
        for parent in known:
            children[parent].append(node)
    order = [node for node, count in waiting.items() if count == 0]
    for node in order:  # grows while iterating
        for child in children[node]:
            waiting[child] -= 1
            if waiting[child] == 0:
                order.append(child)
    return order


def topological_order(job_id: str, parents: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Node ids parents-first; `InvalidJob` for an unknown parent, a self-loop or a cycle."""
    for node, node_parents in parents.items():
        unique = set(node_parents)
        if node in unique or not unique <= parents.keys():
            raise InvalidJob(f"job {job_id} node {node}: bad parents {sorted(unique)}")
    order = parents_first(parents)
    if len(order) != len(parents):
        raise InvalidJob(f"job {job_id}: the nodes' parents form a cycle")
    return tuple(order)
