"""What one tenant's backlog costs every other tenant: the dispatch core's work per event with
a backlog of ready calls of one tenant (its queued jobs times their nodes, 65,536 within the
default quotas), against the same events with no backlog.

Each event is one the gateway handles for any tenant, on its one event loop: a dispatch (the
policy's pick, routed and launched), the end of one of the other tenant's jobs (`--events` of
them, of as many nodes: its unsent calls forgotten, its cost trued up), a gated pool's heads
(what this replica publishes in the pool's share, on each exchange) and a new job's admission
check. Times are the median over `--repeats` of the mean over `--events` events.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.backends import BackendCapacity
from gateway.dispatch_core import DispatchCore
from tenants.policies import JobInfo, NodeCost, ReadyCall, make_policy

NODES = 256  # per job: the default max_nodes_per_job
# a server with 256 free slots that never fill (what is launched is not counted against it)
ROOM = {"engine": BackendCapacity(10**9, 16, 256, 0, 0, True)}


def backlogged(jobs: int, gold_jobs: int, gated: bool) -> DispatchCore[None]:
    """A core whose tenant `hog` has `jobs` jobs of NODES ready roots each, and whose tenant
    `gold` has `gold_jobs` jobs of NODES roots."""
    core: DispatchCore[None] = DispatchCore(make_policy("justitia"), gated=gated)
    for tenant, count in (("hog", jobs), ("gold", gold_jobs)):
        for j in range(count):
            job_id = f"{tenant}-{j}"
            costs = tuple(NodeCost(f"n{i}", (), 16, 16.0, 64) for i in range(NODES))
            core.add_job(JobInfo(job_id, tenant, 1.0, 0.0, costs), 0.0)
            for i in range(NODES):
                call = ReadyCall(f"{job_id}/n{i}", job_id, tenant, f"n{i}", 16, 16.0, 64)
                core.add_ready(call, 16, None, 0.0)
    core.next(0.0, ROOM)  # the policy's first look at every job is not an event's cost
    return core


def per_event_us(event: Callable[[DispatchCore[None], int], object], jobs: int, n: int) -> float:
    """The mean time of `n` events on a core with `jobs` backlogged jobs (and `n` of gold's)."""
    core = backlogged(jobs, n, gated=event is heads)
    start = time.perf_counter()
    for i in range(n):
        event(core, i)
    return (time.perf_counter() - start) / n * 1e6


def dispatch(core: DispatchCore[None], i: int) -> object:
    decision = core.next(1.0, ROOM)
    assert decision is not None
    return core.launched(decision.entry.call.call_id, 1.0)


def job_end(core: DispatchCore[None], i: int) -> object:
    return core.remove_job(f"gold-{i}", 1.0)


def heads(core: DispatchCore[None], i: int) -> object:
    return core.heads(1.0)


def admission(core: DispatchCore[None], i: int) -> object:
    call = ReadyCall(f"new/{i}", "new", "new", "n0", 16, 16.0, 64)
    return core.starts_at_once(call, 16, ROOM)


EVENTS = {"dispatch": dispatch, "job end": job_end, "heads (gated)": heads, "admission": admission}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, nargs="+", default=[0, 64, 256])
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result: dict[str, dict[str, float]] = {}
    for name, event in EVENTS.items():
        result[name] = {}
        for jobs in args.jobs:
            runs = [per_event_us(event, jobs, args.events) for _ in range(args.repeats)]
            result[name][str(jobs * NODES)] = statistics.median(runs)
    backlogs = [str(jobs * NODES) for jobs in args.jobs]
    print(
        f"per event, µs (the other tenant: {args.events} jobs of {NODES} ready calls), "
        "by the backlogged tenant's ready calls: " + " | ".join(backlogs)
    )
    for name, times in result.items():
        print(f"{name:>14}: " + " | ".join(f"{times[b]:10.1f}" for b in backlogs))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
