"""Composing a workload: tenants, their arrivals and their jobs, seeded and deterministic.

`build_workload` draws, for each tenant of `default_tenants` (in order, each from its own
generator seeded by `(seed, tenant index)`), `round(share * num_jobs)` arrival times over a
horizon of `num_jobs` time units (a unit-rate pattern) and one job per arrival: its kind from the
tenant's mix, its nodes from the generator of that kind (agent tasks drawn uniformly from all the
sessions' tasks). `bench.workloads.load.at_load` rescales the pattern to a load. Invariant:
the same data, arguments and seed give the same jobs, byte for byte; jobs are sorted by arrival,
then id.

    python -m bench.workloads.build --out workload.jsonl --jobs 400 --seed 0 --jobs-per-s 0.5
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.paths import add_data_flag
from bench.workloads.agents import load_agent_tasks
from bench.workloads.arrivals import TenantSpec, default_tenants, gamma_arrivals, load_clients
from bench.workloads.format import Job, Node, write_workload
from bench.workloads.task_parallel import TASK_KINDS, load_trace_lengths
from tenants.policies import kv_token_time

DEFAULT_CONTEXT = 8192  # SmolLM2-135M's context window
DEFAULT_MAX_THINK_S = 60.0


def job_work(job: Job) -> float:
    """The job's KV token-time at its true lengths."""
    return sum(kv_token_time(n.prompt_tokens, n.output_tokens) for n in job.nodes)


def build_workload(
    data_dir: Path,
    num_jobs: int,
    seed: int = 0,
    context: int = DEFAULT_CONTEXT,
    max_think_s: float = DEFAULT_MAX_THINK_S,
    tenants: Sequence[TenantSpec] | None = None,
) -> list[Job]:
    """Jobs on a unit-rate pattern: about one arrival per time unit over `num_jobs` units."""
    specs = list(tenants) if tenants is not None else default_tenants(load_clients(data_dir))
    uses_agents = any(kind == "agent" for t in specs for kind, _ in t.kinds)
    agent_tasks = load_agent_tasks(data_dir, context, max_think_s) if uses_agents else []
    lengths = load_trace_lengths(data_dir, context)
    jobs = []
    for index, tenant in enumerate(specs):
        rng = np.random.default_rng([seed, index])
        times = gamma_arrivals(rng, round(tenant.share * num_jobs), tenant.cv, float(num_jobs))
        kinds = [k for k, _ in tenant.kinds]
        probs = np.asarray([p for _, p in tenant.kinds]) / sum(p for _, p in tenant.kinds)
        for k, arrival in enumerate(times):
            kind = kinds[int(rng.choice(len(kinds), p=probs))]
            nodes: tuple[Node, ...]
            if kind == "agent":
                nodes = agent_tasks[int(rng.integers(len(agent_tasks)))]
            else:
                nodes = TASK_KINDS[kind](rng, lengths)
            job_id = f"{tenant.name}-{k:05d}"
            jobs.append(Job(job_id, tenant.name, tenant.weight, float(arrival), kind, nodes))
    return sorted(jobs, key=lambda j: (j.arrival, j.job_id))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.workloads.build", description=__doc__)
    add_data_flag(parser)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=DEFAULT_CONTEXT)
    parser.add_argument("--max-think-s", type=float, default=DEFAULT_MAX_THINK_S)
    parser.add_argument("--jobs-per-s", type=float, default=1.0, help="mean arrival rate")
    args = parser.parse_args(argv)
    jobs = build_workload(args.data, args.jobs, args.seed, args.context, args.max_think_s)
    write_workload(args.out, [j.at(j.arrival / args.jobs_per_s) for j in jobs])
    print(f"wrote {len(jobs)} jobs to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
