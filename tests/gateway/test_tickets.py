"""A job split by pool: each pool's policy sees its nodes, parents in other pools left out."""

from __future__ import annotations

from gateway.tickets import part_of
from tenants.policies import JobInfo, NodeCost


def test_a_pool_sees_its_nodes_and_only_their_parents_in_the_same_pool() -> None:
    nodes = (
        NodeCost("draft", (), 10, 5.0, 20),
        NodeCost("check", ("draft",), 20, 5.0, 20),
        NodeCost("review", ("draft", "check"), 30, 5.0, 20),
    )
    info = JobInfo("j", "t", 1.0, 0.0, nodes, priority=3)
    large = part_of(info, {"check", "review"})
    assert [(n.node_id, n.parents) for n in large.nodes] == [
        ("check", ()),
        ("review", ("check",)),
    ]
    assert (large.job_id, large.tenant_id, large.priority) == ("j", "t", 3)
    assert part_of(info, {"draft", "check", "review"}) == info
