"""Agent jobs from the kv-cache-tester sessions: one task of a session is one job.

A session (one `trace` of `DERIVED_all_traces_nohash.jsonl`) is a list of calls; a `subagent`
marker in a list opens a nested list (its `path` names the marker) that runs beside its parent.
A session is cut into tasks after every call that stopped with `end_turn` (the agent hands back
to the user; the think time before the next call is the user's, so it is not part of any job).
Inside a task the calls of a list form a chain: each waits for the previous one plus its own
`think_time` (clipped to `max_think_s`). A subagent's first call follows the call before its
marker; its last call joins back as a parent of the first call of the enclosing list that was
issued after the subagent ended (`abs_t + api_time` of its last call), or ends the job when
there is none. Lengths: outputs are kept; prompts are scaled by `context / 200_000` (Claude's
window onto the serving model's) and then fitted as `fit_to_context` says. Invariant: every job
is a valid DAG whose calls are the session's calls of that task, each exactly once.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.paths import existing
from bench.workloads.format import Node
from bench.workloads.lengths import fit_to_context

AGENT_TRACE = Path("agents/kv-cache-tester/DERIVED_all_traces_nohash.jsonl")
SOURCE_CONTEXT = 200_000  # Claude's context window, the sessions' upstream model


@dataclass(slots=True)
class _Entry:
    idx: int
    row: dict[str, Any]
    children: list[_Entry] = field(default_factory=list)  # a subagent marker's own list

    @property
    def is_marker(self) -> bool:
        return bool(self.row.get("type") == "subagent")


@dataclass(slots=True)
class _Builder:
    context: int
    max_think_s: float
    nodes: list[Node] = field(default_factory=list)
    joins: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, row: dict[str, Any], parent: str | None, think: float) -> str:
        node_id = f"n{len(self.nodes)}"
        scaled = round(int(row["in"]) * self.context / SOURCE_CONTEXT)
        prompt, output, max_tokens = fit_to_context(scaled, int(row["out"]), self.context)
        parents = (parent,) if parent is not None else ()
        think_s = min(max(float(think), 0.0), self.max_think_s)
        self.nodes.append(Node(node_id, parents, prompt, output, max_tokens, think_s))
        return node_id

    def finish(self) -> tuple[Node, ...]:
        return tuple(
            replace(node, parents=node.parents + tuple(self.joins.get(node.node_id, ())))
            for node in self.nodes
        )


def _end_time(row: dict[str, Any]) -> float:
    return float(row["abs_t"]) + float(row.get("api_time") or 0.0)


def _add_list(b: _Builder, entries: list[_Entry], parent: str | None) -> tuple[str | None, float]:
    """Chain `entries` after `parent`; returns the last call's node id and end time."""
    last, end = parent, 0.0
    pending: list[tuple[str, float]] = []  # subagent branches not yet joined: (last node, end)
    for i, entry in enumerate(entries):
        if entry.is_marker:
            branch_last, branch_end = _add_list(b, entry.children, last)
            if branch_last is not None and branch_last != last:
                pending.append((branch_last, branch_end))
            continue
        think = float(entry.row.get("think_time") or 0.0) if i else 0.0
        node_id = b.add(entry.row, last, think if last is not None else 0.0)
        started = float(entry.row["abs_t"])
        for branch in [p for p in pending if p[1] <= started]:
            b.joins[node_id].append(branch[0])
            pending.remove(branch)
        last, end = node_id, _end_time(entry.row)
    return last, end


def _tasks(entries: list[_Entry]) -> list[list[_Entry]]:
    """Cut a top-level list after each `end_turn` call."""
    tasks: list[list[_Entry]] = [[]]
    for entry in entries:
        tasks[-1].append(entry)
        if entry.row.get("stop") == "end_turn":
            tasks.append([])
    return [t for t in tasks if any(not e.is_marker for e in t)]


def _session_lists(rows: list[dict[str, Any]]) -> list[_Entry]:
    """The top-level list of one session with each marker's nested list attached."""
    lists: dict[tuple[int, ...], list[_Entry]] = defaultdict(list)
    for row in rows:
        lists[tuple(row["path"])].append(_Entry(int(row["idx"]), row))
    for path, entries in lists.items():
        entries.sort(key=lambda e: e.idx)
        for entry in entries:
            if entry.is_marker:
                entry.children = lists.get((*path, entry.idx), [])
    return lists.get((), [])


def agent_tasks_from_rows(
    rows: list[dict[str, Any]], context: int, max_think_s: float
) -> list[tuple[Node, ...]]:
    """Every task of every session in `rows` (lines of the derived trace) as a job's nodes."""
    sessions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sessions[str(row["trace"])].append(row)
    jobs = []
    for name in sorted(sessions):
        for task in _tasks(_session_lists(sessions[name])):
            builder = _Builder(context, max_think_s)
            _add_list(builder, task, None)
            jobs.append(builder.finish())
    return jobs


def load_agent_tasks(data_dir: Path, context: int, max_think_s: float) -> list[tuple[Node, ...]]:
    with existing(data_dir / AGENT_TRACE).open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return agent_tasks_from_rows(rows, context, max_think_s)
