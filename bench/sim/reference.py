"""The fairness yardstick of the study: GPS finish times and the slack Δ of the bound.

A job's GPS finish comes from `tenants.policies.gps_finish_times` on the true lengths and think
delays, with the engine's measured capacity: `capacity` KV token-slots per step of
`step_seconds` (the capacity probe's throughput times its mean step). Δ is the longest single
call's run time alone on the empty engine under the regime's step model: its prompt in chunks of
the token budget, then one decode step per further output token. The bound a job must meet is
`finish <= gps_finish + Δ`. Invariant: neither depends on the policy under study.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.sim.gps import GpsCall, GpsJob, gps_finish_times
from bench.workloads.format import Job, Node
from engine import StepShape, StepTimeModel


def gps_finish(jobs: Sequence[Job], capacity: float, step_seconds: float) -> dict[str, float]:
    gps_jobs = [
        GpsJob(
            j.job_id,
            j.tenant,
            j.weight,
            j.arrival,
            tuple(
                GpsCall(n.node_id, n.parents, n.prompt_tokens, n.output_tokens, n.think_s)
                for n in j.nodes
            ),
        )
        for j in jobs
    ]
    return gps_finish_times(gps_jobs, capacity, step_seconds=step_seconds)


def solo_call_seconds(node: Node, model: StepTimeModel, token_budget: int) -> float:
    """A call's run time alone: prefill chunks, then `output - 1` decode steps."""
    p, d = node.prompt_tokens, node.output_tokens
    prefill = sum(
        model.shape_time(StepShape.chunk(start, min(token_budget, p - start)))
        for start in range(0, p, token_budget)
    )
    decodes = d - 1
    decode = decodes * (model.overhead_s + model.per_token_s)
    decode += model.per_context_token_s * (decodes * p + decodes * (decodes + 1) / 2)
    return prefill + decode


def bound_slack(jobs: Sequence[Job], model: StepTimeModel, token_budget: int) -> float:
    """Δ: the longest single call's solo run time in the workload."""
    return max(solo_call_seconds(n, model, token_budget) for j in jobs for n in j.nodes)
