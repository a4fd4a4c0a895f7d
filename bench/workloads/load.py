"""Offered load over the arrival window, for jobs whose own structure limits their speed.

A job alone runs each call for `output_tokens` engine steps of `step_seconds` (a token a step,
as in the GPS reference), starting `think_s` after its last parent ends (a root: after the
arrival). While it runs, a call offers its KV token-time evenly over its duration. The offered
load of a workload is the KV token-time its jobs would use inside the arrival window [first
arrival, last arrival] if nothing slowed them, divided by what the engine serves in that window
(`capacity` KV token-slots per step). For a stream far longer than its longest job this is the
usual `rate * mean work / capacity`; for a finite stream of heavy-tailed agent jobs (a long
chain with think pauses uses one call at a time for hours) it does not count work that could only
happen after the window. `at_load` rescales arrival times, by bisection on the time scale, to
reach a target (the load of jobs all arriving at once bounds what is reachable). Invariant:
rescaling keeps the arrival order and every job's own timeline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bench.workloads.errors import LoadUnreachable
from bench.workloads.format import Job, Node
from tenants.policies import kv_token_time


def solo_timeline(
    job: Job, call_seconds: Callable[[Node], float]
) -> list[tuple[float, float, float]]:
    """(start, end, work) of each call, relative to the arrival, when the job runs alone."""
    end: dict[str, float] = {}
    out = []
    pending = list(job.nodes)
    while pending:  # nodes in file order need not be parents-first
        later = []
        for node in pending:
            if all(p in end for p in node.parents):
                start = max((end[p] for p in node.parents), default=0.0) + node.think_s
                end[node.node_id] = start + call_seconds(node)
                work = kv_token_time(node.prompt_tokens, node.output_tokens)
                out.append((start, end[node.node_id], work))
            else:
                later.append(node)
        assert len(later) < len(pending), "the format guarantees an acyclic job"
        pending = later
    return out


class OfferedLoad:
    """The offered load of `jobs` at any time scale of their arrival pattern."""

    def __init__(self, jobs: Sequence[Job], capacity: float, step_seconds: float) -> None:
        self.pattern = np.asarray([j.arrival for j in jobs], dtype=np.float64)
        self.pattern -= self.pattern.min()
        rows = [
            (i, start, end, work)
            for i, job in enumerate(jobs)
            for start, end, work in solo_timeline(job, lambda n: n.output_tokens * step_seconds)
        ]
        data = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
        self.owner = data[:, 0].astype(np.int64)
        self.start, self.end, self.work = data[:, 1], data[:, 2], data[:, 3]
        self.rate_capacity = capacity / step_seconds  # KV token-time per second

    def at_scale(self, scale: float) -> float:
        """The offered load when arrivals are `scale` times the pattern's times."""
        window = scale * float(self.pattern.max())
        if window <= 0:
            return float("inf")
        begin = scale * self.pattern[self.owner] + self.start
        finish = scale * self.pattern[self.owner] + self.end
        overlap = np.clip(np.minimum(finish, window) - begin, 0.0, None)
        share = np.divide(overlap, finish - begin, out=np.ones_like(overlap), where=finish > begin)
        inside = np.where(finish > begin, share, (begin <= window).astype(np.float64))
        return float((self.work * inside).sum() / (window * self.rate_capacity))

    def scale_for(self, load: float) -> float:
        """The time scale whose offered load is `load` (bisection on a log scale)."""
        low, high = 1e-9, 1.0
        if self.at_scale(low) < load:
            raise LoadUnreachable(
                f"load {load} is out of reach: even arriving at once the jobs offer "
                f"{self.at_scale(low):.3f} (they are too few or too slow for this engine)"
            )
        while self.at_scale(high) > load:
            high *= 2.0
        for _ in range(100):
            mid = (low * high) ** 0.5
            if self.at_scale(mid) > load:
                low = mid
            else:
                high = mid
        return high


def at_load(jobs: Sequence[Job], load: float, capacity: float, step_seconds: float) -> list[Job]:
    """The jobs with arrival times rescaled (first arrival at 0) to offer `load`."""
    if not (load > 0 and capacity > 0 and step_seconds > 0):
        raise ValueError("load, capacity and step_seconds must be > 0")
    offered = OfferedLoad(jobs, capacity, step_seconds)
    scale = offered.scale_for(load)
    return [job.at(float(scale * t)) for job, t in zip(jobs, offered.pattern, strict=True)]
