"""A job split by pool: each pool's policy sees its nodes, parents in other pools left out."""

from __future__ import annotations

from array import array

import pytest

from gateway.calls import CallDefaults, CallPlanner
from gateway.job_run import JobRun
from gateway.jobs.model import JobSpec, NodeSpec
from gateway.server import LENGTH_PRIOR
from gateway.tickets import Blank, node_costs, part_of
from predictor.error_tracker import ErrorTracker
from predictor.history import HistoryPredictor
from tenants import TenantQuota
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


def test_a_kind_of_call_in_conservative_mode_is_costed_so_on_its_jobs_arrival() -> None:
    """A job's arrival cost took every node's predicted mean: a tenant whose kind of call kept
    running long (conservative, its ready calls ordered by their widened p90) still looked short
    in each new job's tag, chain and longest-job rule until each call was ready."""
    tracker = ErrorTracker()
    planner = CallPlanner(HistoryPredictor(LENGTH_PRIOR), None, CallDefaults(), None, tracker)
    quota = TenantQuota(max_tokens_ceiling=1024, default_max_tokens=1024)
    spec = JobSpec(nodes=(NodeSpec(id="a", prompt_template="x", name="summarise"),))
    blanks = {"a": Blank("x", array("i", [1, 2, 3]))}

    def costed(tenant: str) -> float:
        run = JobRun(f"{tenant}-job", tenant, spec, 0.0)
        (node,) = node_costs(run, quota, blanks, planner, {"a": ""})
        return node.predicted_output

    liar = planner.plan("liar", spec.nodes[0], "x", 3, quota)
    # three calls of its kind past their p90 as they run: the third turns it conservative
    assert [planner.overran(liar, 1000) for _ in range(3)] == [False, False, True]
    assert costed("liar") == 1024  # its calls still running long count at their max_tokens
    assert costed("honest") == pytest.approx(LENGTH_PRIOR.mean)
