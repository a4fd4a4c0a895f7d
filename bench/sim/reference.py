"""The fairness yardstick of the study: GPS finish times and the slack Δ of the bound.

A job's GPS finish comes from `tenants.policies.gps_finish_times` on the true lengths and think
delays, with the engine's measured capacity: `capacity` KV token-slots per step of
`step_seconds` (the capacity probe's throughput times its mean step). Δ is the longest single
call's run time alone on the empty engine under the regime's step model: its prompt in chunks of
the token budget, then one decode step per further output token. The bound a job must meet is
`finish <= gps_finish + Δ`. Invariant: neither depends on the policy under study.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.workloads.format import Job, Node
from engine import StepTimeModel
from engine.sim_runner import prefill_pairs
from tenants.policies import GpsCall, GpsJob, gps_finish_times


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
    chunks = math.ceil(p / token_budget)
    prefill = chunks * model.overhead_s + p * model.per_token_s
    starts = [k * token_budget for k in range(chunks)]
    ends = [min(p, s + token_budget) for s in starts]
    prefill += model.per_context_token_s * sum(ends)
    pairs = sum(prefill_pairs(s, e - s) for s, e in zip(starts, ends, strict=True))
    prefill += model.per_prefill_pair_s * pairs
    decodes = d - 1
    decode = decodes * (model.overhead_s + model.per_token_s)
    decode += model.per_context_token_s * (decodes * p + decodes * (decodes + 1) / 2)
    return prefill + decode


def bound_slack(jobs: Sequence[Job], model: StepTimeModel, token_budget: int) -> float:
    """Δ: the longest single call's solo run time in the workload."""
    return max(solo_call_seconds(n, model, token_budget) for j in jobs for n in j.nodes)
