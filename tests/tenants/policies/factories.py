"""Small builders for policy tests: nodes, jobs, ready calls, and a dispatch helper."""

from __future__ import annotations

from collections.abc import Sequence

from tenants.policies import EngineLoad, JobInfo, NodeCost, Policy, ReadyCall

NO_KNEE = EngineLoad(running_calls=0, batch_tokens=0, knee_calls=None)


def make_node(
    node_id: str = "n",
    parents: Sequence[str] = (),
    *,
    prompt: int = 100,
    predicted: float = 50.0,
    max_tokens: int = 1024,
    true: int | None = None,
) -> NodeCost:
    truth = round(predicted) if true is None else true
    return NodeCost(node_id, tuple(parents), prompt, predicted, max_tokens, truth)


def make_job(
    job_id: str,
    tenant: str = "t1",
    nodes: Sequence[NodeCost] | None = None,
    *,
    weight: float = 1.0,
    arrival: float = 0.0,
    priority: int = 0,
) -> JobInfo:
    return JobInfo(job_id, tenant, weight, arrival, tuple(nodes or (make_node(),)), priority)


def make_ready(job: JobInfo, node_id: str | None = None, *, prompt: int | None = None) -> ReadyCall:
    node = next(n for n in job.nodes if node_id is None or n.node_id == node_id)
    return ReadyCall(
        call_id=f"{job.job_id}/{node.node_id}",
        job_id=job.job_id,
        tenant_id=job.tenant_id,
        node_id=node.node_id,
        prompt_tokens=node.prompt_tokens if prompt is None else prompt,
        predicted_output=node.predicted_output,
        max_tokens=node.max_tokens,
    )


def submit(policy: Policy, job: JobInfo, now: float = 0.0) -> None:
    """Add the job and make its root nodes ready, as the gateway does."""
    policy.add_job(job, now)
    for node in job.nodes:
        if not node.parents:
            policy.add_ready(make_ready(job, node.node_id), now)


def dispatch_all(policy: Policy, now: float = 0.0) -> list[str]:
    """Dispatch every ready call in the policy's order; return their call ids."""
    order = []
    while (call := policy.peek(now, NO_KNEE)) is not None:
        policy.mark_dispatched(call.call_id, now)
        order.append(call.call_id)
    return order
