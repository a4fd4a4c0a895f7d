"""What the fairness bound needs: orders that know the GPS reference (a diagnostic, not a policy).

Clairvoyant orders built from the study's yardstick, to learn which information a policy would
need to keep every job within `gps_finish + Δ`. `job`: jobs in the order of their reference finish
(Justitia with exact, cap-aware ideal finishes). `call`: earliest deadline first over calls, a
call's deadline being the latest start that still lets its job end by its reference finish, i.e.
`gps_finish - (the longest remaining path from the call: solo call times and the think delays
before each later call)`; `--think` says what the path counts for those delays: the true ones
(`exact`), each job's mean (`job-mean`), or nothing (`none`). A job's key is its most urgent ready
call, which goes first.

    python -m bench.sim.deadlines --order call --think exact    # gpu, load 0.9, 600 jobs
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence

from bench.paths import add_data_flag
from bench.sim.metrics import RunMetrics, run_metrics
from bench.sim.predictions import oracle
from bench.sim.reference import solo_call_seconds
from bench.sim.regime import CPU_STEP_MODEL, cpu_regime, gpu_regime
from bench.sim.setup import Prepared, prepare
from bench.sim.simulator import Simulation
from bench.sim.study import Yardstick, yardstick
from bench.workloads.build import DEFAULT_CONTEXT, DEFAULT_MAX_THINK_S, build_workload
from bench.workloads.format import Job, Node
from bench.workloads.load import at_load
from tenants.policies import BookPolicy, ReadyCall
from tenants.policies.bookkeeping import ActiveJob, OrderKey
from tenants.policies.dag import topological_order

THINK_MODES = ("exact", "job-mean", "none")


def think_of(job: Job, mode: str) -> Callable[[Node], float]:
    """The think delay the deadline counts before a node."""
    if mode == "exact":
        return lambda node: node.think_s
    if mode == "job-mean":
        delays = [n.think_s for n in job.nodes if n.parents]
        mean = sum(delays) / len(delays) if delays else 0.0
        return lambda node: mean
    return lambda node: 0.0


def latest_starts(
    jobs: Sequence[Job], gps: Mapping[str, float], call_s: Callable[[Node], float], mode: str
) -> dict[tuple[str, str], float]:
    """(job id, node id) -> the latest start that lets the job end by its GPS finish."""
    out = {}
    for job in jobs:
        think = think_of(job, mode)
        nodes = {n.node_id: n for n in job.nodes}
        children: dict[str, list[str]] = {node_id: [] for node_id in nodes}
        for node in job.nodes:
            for parent in node.parents:
                children[parent].append(node.node_id)
        order = topological_order(job.job_id, {n.node_id: n.parents for n in job.nodes})
        from_start: dict[str, float] = {}  # a node's start to its job's end, at the least
        for node_id in reversed(order):
            after = (think(nodes[c]) + from_start[c] for c in children[node_id])
            from_start[node_id] = call_s(nodes[node_id]) + max(after, default=0.0)
            out[job.job_id, node_id] = gps[job.job_id] - from_start[node_id]
    return out


class DeadlineOracle(BookPolicy):
    name = "deadline-oracle"

    def __init__(
        self, gps: Mapping[str, float], starts: Mapping[tuple[str, str], float], *, by_call: bool
    ) -> None:
        super().__init__()
        self._gps = gps
        self._starts = starts
        self._by_call = by_call

    def _deadline(self, job: ActiveJob, call: ReadyCall) -> float:
        return self._starts[job.info.job_id, call.node_id]

    def _job_order(self, job: ActiveJob, now: float) -> OrderKey:
        if not self._by_call:
            return (self._gps[job.info.job_id], job.info.job_id)
        return (min(self._deadline(job, c) for c in job.ready.values()), job.info.job_id)

    def _first_call(self, job: ActiveJob) -> ReadyCall:
        return min(job.ready.values(), key=lambda c: self._deadline(job, c))

    def _job_priority(self, job: ActiveJob) -> float:
        return self._gps[job.info.job_id]


def run_oracle(
    jobs: list[Job], prepared: Prepared, stick: Yardstick, order: str, mode: str
) -> RunMetrics:
    model, budget = prepared.regime.step_model, prepared.setup.config.max_num_batched_tokens
    starts = latest_starts(jobs, stick.gps, lambda n: solo_call_seconds(n, model, budget), mode)
    policy = DeadlineOracle(stick.gps, starts, by_call=order == "call")
    result = Simulation(jobs, policy, prepared.setup, oracle(jobs)).run()
    return run_metrics(jobs, result, stick.gps, stick.delta, stick.solo, stick.solo_think)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim.deadlines", description=__doc__)
    add_data_flag(p)
    p.add_argument("--jobs", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--regime", choices=["cpu", "gpu"], default="gpu")
    p.add_argument("--load", type=float, default=0.9)
    p.add_argument("--order", choices=["call", "job"], default="call")
    p.add_argument("--think", choices=THINK_MODES, default="exact")
    args = p.parse_args(argv)
    base = build_workload(args.data, args.jobs, args.seed, DEFAULT_CONTEXT, DEFAULT_MAX_THINK_S)
    regime = gpu_regime() if args.regime == "gpu" else cpu_regime(CPU_STEP_MODEL)
    prepared = prepare(base, regime)
    jobs = at_load(base, args.load, prepared.capacity, prepared.step_seconds)
    stick = yardstick(jobs, prepared)
    m = run_oracle(jobs, prepared, stick, args.order, args.think)
    think = args.think if args.order == "call" else "n/a"
    print(
        f"{args.regime} load {args.load} order {args.order} think {think}: avg JCT "
        f"{m.avg_jct:.1f} s, bound violations {m.bound_violations} of {len(jobs)}, "
        f"avg queueing {m.avg_queueing:.1f} s, {m.throughput:.0f} tokens/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
