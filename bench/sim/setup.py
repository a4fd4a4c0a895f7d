"""Sizing the engine for a workload and measuring its capacity.

The engine's pool is sized from the workload's mean call (prompt + output) as the regime says;
its context is the workload's largest `prompt + max_tokens`. The knee (cpu) uses the workload's
mean decoding context, KV token-time per output token. Capacity probe: the workload's jobs all
arrive within a microsecond (in their order) and fcfs runs them until half their work is done;
the engine's capacity is the KV token-time it served per step over the steps taken while a ready
call waited for room (saturated steps), and `step_seconds` their mean length. The same numbers
define the load (`bench.workloads.load`) and the GPS reference. Invariant: the probe depends only
on the workload and the regime, never on the policy under study.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.sim.errors import ProbeUnsaturated
from bench.sim.predictions import oracle
from bench.sim.regime import Regime
from bench.sim.simulator import EngineSetup, Simulation
from bench.workloads.build import job_work
from bench.workloads.format import Job
from tenants.policies import kv_token_time, make_policy


@dataclass(frozen=True, slots=True)
class Prepared:
    regime: Regime
    setup: EngineSetup
    capacity: float  # KV token-slots served per saturated step
    step_seconds: float  # mean saturated step
    context: int  # the engine's max_model_len

    @property
    def work_per_second(self) -> float:
        return self.capacity / self.step_seconds


def engine_setup(jobs: Sequence[Job], regime: Regime) -> tuple[EngineSetup, int]:
    calls = [n for j in jobs for n in j.nodes]
    mean_call = float(np.mean([n.prompt_tokens + n.output_tokens for n in calls]))
    context = max(n.prompt_tokens + n.max_tokens for n in calls)
    num_blocks = regime.num_blocks(mean_call, context)
    config = regime.engine_config(context, num_blocks)
    knee = regime.knee_calls(mean_decode_context(jobs))
    return EngineSetup(config, regime.step_model, knee), context


def mean_decode_context(jobs: Sequence[Job]) -> float:
    """The context a decoding call reads, on average over every output token of the jobs: their
    KV token-time per output token."""
    calls = [n for j in jobs for n in j.nodes]
    work = sum(kv_token_time(n.prompt_tokens, n.output_tokens) for n in calls)
    return work / sum(n.output_tokens for n in calls)


def prepare(jobs: Sequence[Job], regime: Regime) -> Prepared:
    setup, context = engine_setup(jobs, regime)
    burst = [j.at(1e-6 * i / len(jobs)) for i, j in enumerate(jobs)]
    half = sum(job_work(j) for j in jobs) / 2
    probe = Simulation(burst, make_policy("fcfs"), setup, oracle(jobs), stop_after_work=half)
    result = probe.run()
    if result.saturated_steps == 0:
        raise ProbeUnsaturated("the capacity probe never filled the engine: too few jobs")
    capacity = result.saturated_work / result.saturated_steps
    return Prepared(regime, setup, capacity, result.saturated_s / result.saturated_steps, context)
