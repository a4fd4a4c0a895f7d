"""Job DAG checks shared by the policies and the GPS reference: known parents, no cycles.

Kahn's algorithm: a node joins the order once all its parents are in it, so the order lists
parents before children; nodes left out sit on a cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tenants.policies.errors import InvalidJob


def topological_order(job_id: str, parents: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Node ids parents-first; `InvalidJob` for an unknown parent, a self-loop or a cycle."""
    children: dict[str, list[str]] = {node: [] for node in parents}
    pending: dict[str, int] = {}
    for node, node_parents in parents.items():
        unique = set(node_parents)
        if node in unique or not unique <= children.keys():
            raise InvalidJob(f"job {job_id} node {node}: bad parents {sorted(unique)}")
        pending[node] = len(unique)
        for parent in unique:
            children[parent].append(node)
    order = [node for node, count in pending.items() if count == 0]
    for node in order:  # grows while iterating
        for child in children[node]:
            pending[child] -= 1
            if pending[child] == 0:
                order.append(child)
    if len(order) != len(parents):
        raise InvalidJob(f"job {job_id}: the nodes' parents form a cycle")
    return tuple(order)
