"""The JSONL workload format: one job a line, a DAG of calls with their true lengths.

A job line holds its id, tenant, tenant weight, arrival time (seconds), kind (free text naming
the generator) and nodes; a node holds its id, parents, prompt tokens, true output tokens,
max_tokens and an optional think delay (seconds after its last parent finished, or after the
arrival for a root, before the call is issued). Reading checks every job: numbers in range
(`1 <= output_tokens <= max_tokens`, prompt >= 1), known parents and no cycle, one weight per
tenant, unique job ids. Invariant: `read_workload(write_workload(jobs)) == jobs`, and every job
that either returns satisfies those checks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.workloads.errors import WorkloadInvalid
from tenants.policies.dag import topological_order
from tenants.policies.errors import InvalidJob


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    parents: tuple[str, ...]
    prompt_tokens: int
    output_tokens: int  # the true length the call generates
    max_tokens: int  # the enforced cap; output_tokens <= max_tokens
    think_s: float = 0.0  # delay after the last parent (or the arrival) before the call


@dataclass(frozen=True, slots=True)
class Job:
    job_id: str
    tenant: str
    weight: float
    arrival: float
    kind: str
    nodes: tuple[Node, ...]

    def at(self, arrival: float) -> Job:
        return replace(self, arrival=arrival)


def node_to_json(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": node.node_id,
        "parents": list(node.parents),
        "prompt_tokens": node.prompt_tokens,
        "output_tokens": node.output_tokens,
        "max_tokens": node.max_tokens,
    }
    if node.think_s:
        out["think_s"] = node.think_s
    return out


def job_to_json(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "tenant": job.tenant,
        "weight": job.weight,
        "arrival": job.arrival,
        "kind": job.kind,
        "nodes": [node_to_json(n) for n in job.nodes],
    }


def job_from_json(data: Mapping[str, Any]) -> Job:
    """One job from its JSON object; `WorkloadInvalid` when a field is missing or malformed."""
    try:
        nodes = tuple(
            Node(
                str(n["id"]),
                tuple(str(p) for p in n.get("parents", ())),
                int(n["prompt_tokens"]),
                int(n["output_tokens"]),
                int(n["max_tokens"]),
                float(n.get("think_s", 0.0)),
            )
            for n in data["nodes"]
        )
        job = Job(
            str(data["job_id"]),
            str(data["tenant"]),
            float(data.get("weight", 1.0)),
            float(data["arrival"]),
            str(data.get("kind", "")),
            nodes,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadInvalid(f"malformed job {data.get('job_id', '?')!r}: {exc!r}") from exc
    validate_workload_job(job)
    return job


def validate_workload_job(job: Job) -> None:
    if not (math.isfinite(job.weight) and job.weight > 0 and math.isfinite(job.arrival)):
        raise WorkloadInvalid(f"job {job.job_id}: weight must be > 0 and arrival finite")
    if not job.nodes or len({n.node_id for n in job.nodes}) != len(job.nodes):
        raise WorkloadInvalid(f"job {job.job_id}: no nodes or duplicate node ids")
    for n in job.nodes:
        if not (n.prompt_tokens >= 1 and 1 <= n.output_tokens <= n.max_tokens):
            raise WorkloadInvalid(
                f"job {job.job_id} node {n.node_id}: need prompt >= 1 and "
                f"1 <= output_tokens ({n.output_tokens}) <= max_tokens ({n.max_tokens})"
            )
        if not (math.isfinite(n.think_s) and n.think_s >= 0):
            raise WorkloadInvalid(f"job {job.job_id} node {n.node_id}: bad think_s")
    try:
        topological_order(job.job_id, {n.node_id: n.parents for n in job.nodes})
    except InvalidJob as exc:
        raise WorkloadInvalid(str(exc)) from exc


def validate_workload(jobs: Iterable[Job]) -> None:
    """Checks across jobs: unique ids and one weight per tenant."""
    seen: set[str] = set()
    weights: dict[str, float] = {}
    for job in jobs:
        if job.job_id in seen:
            raise WorkloadInvalid(f"duplicate job id {job.job_id}")
        seen.add(job.job_id)
        if weights.setdefault(job.tenant, job.weight) != job.weight:
            raise WorkloadInvalid(f"tenant {job.tenant}: jobs disagree on the weight")


def write_workload(path: Path, jobs: Iterable[Job]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for job in jobs:
            f.write(json.dumps(job_to_json(job), separators=(",", ":")) + "\n")


def read_workload(path: Path) -> list[Job]:
    """Jobs of a JSONL file, sorted by arrival (then id); blank lines are skipped."""
    jobs = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadInvalid(f"{path}:{number}: not JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise WorkloadInvalid(f"{path}:{number}: a job must be a JSON object")
            jobs.append(job_from_json(data))
    if not jobs:
        raise WorkloadInvalid(f"{path}: no jobs")
    validate_workload(jobs)
    return sorted(jobs, key=lambda j: (j.arrival, j.job_id))
