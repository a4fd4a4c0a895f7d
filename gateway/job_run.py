"""One submitted job's life: node states, outputs, and the event log its watchers read.

A node is PENDING until all its parents have succeeded, then READY (its prompt can be
rendered from the job inputs and the parents' outputs), RUNNING on the engine, and ends
SUCCEEDED, CAPPED (stopped by the anomaly guard; its output still feeds dependents), FAILED or
CANCELLED. A failed node fails every descendant with a reason naming it; independent branches
run on. The job ends when every node has ended: SUCCEEDED when none failed or was cancelled.

Invariant: the event log only grows, its sequence numbers are 1, 2, 3, ...; every state change
appears in it exactly once, and the last event of an ended job is JobFinished.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

from gateway.jobs.dag import Dag
from gateway.jobs.model import ChatMessage, JobSpec, NodeSpec
from gateway.jobs.template import render_node


class NodeState(enum.Enum):
    PENDING = "pending"
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CAPPED = "capped"


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


DONE = frozenset({NodeState.SUCCEEDED, NodeState.CAPPED})
ENDED = DONE | {NodeState.FAILED, NodeState.CANCELLED}


@dataclass(slots=True)
class NodeRun:
    spec: NodeSpec
    state: NodeState = NodeState.PENDING
    output: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    reason: str = ""
    hit_length: bool = False  # generation stopped at max_tokens rather than at a stop
    ready_at: float | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None


@dataclass(frozen=True, slots=True)
class NodeChanged:
    node_id: str
    state: NodeState
    previous: NodeState
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TokensAdded:
    node_id: str
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class JobEnded:
    state: JobState


@dataclass(frozen=True, slots=True)
class JobEvent:
    sequence: int
    time: float
    body: NodeChanged | TokensAdded | JobEnded


@dataclass(slots=True)
class JobRun:
    job_id: str
    tenant_id: str
    spec: JobSpec
    created_at: float
    state: JobState = JobState.QUEUED
    started_at: float | None = None
    finished_at: float | None = None
    nodes: dict[str, NodeRun] = field(default_factory=dict)
    events: list[JobEvent] = field(default_factory=list)
    _dag: Dag | None = None
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self.nodes = {n.id: NodeRun(n) for n in self.spec.nodes}
        self._dag = Dag.of_job(self.spec)

    @property
    def dag(self) -> Dag:
        assert self._dag is not None
        return self._dag

    @property
    def ended(self) -> bool:
        return self.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    def start(self, now: float) -> list[str]:
        """Mark the job running; returns the nodes ready at once (the roots)."""
        self.state, self.started_at = JobState.RUNNING, now
        return self._release(list(self.dag.roots()), now)

    def prompt(self, node_id: str) -> str | tuple[ChatMessage, ...]:
        """The node's rendered prompt text or chat messages, from inputs and ancestors."""
        outputs = {a: self.nodes[a].output for a in self.dag.ancestors(node_id)}
        return render_node(self.nodes[node_id].spec, self.spec.inputs, outputs)

    def mark_running(self, node_id: str, prompt_tokens: int, now: float) -> None:
        node = self.nodes[node_id]
        self._set(node_id, NodeState.RUNNING, now)
        node.prompt_tokens, node.started_at = prompt_tokens, now

    def add_tokens(self, node_id: str, text: str, token_ids: tuple[int, ...], now: float) -> None:
        """Tokens of a running node; dropped once it has ended (a cancelled call's last ones)."""
        node = self.nodes[node_id]
        if node.state in ENDED:
            return
        if node.first_token_at is None:
            node.first_token_at = now
        node.output += text
        node.output_tokens += len(token_ids)
        self._emit(TokensAdded(node_id, text, token_ids), now)

    def finish_node(
        self, node_id: str, state: NodeState, now: float, reason: str = ""
    ) -> list[str]:
        """End a node; returns the nodes this makes ready."""
        assert state in ENDED
        if self.nodes[node_id].state in ENDED:
            return []
        self._end(node_id, state, now, reason)
        if state in DONE:
            ready = [c for c in self.dag.children[node_id] if self._parents_done(c)]
            released = self._release(ready, now)
        else:
            released = []
            for child in self._descendants(node_id):
                if self.nodes[child].state not in ENDED:
                    self._end(child, NodeState.FAILED, now, f"parent {node_id!r} {state.value}")
        self._maybe_end(now)
        return released

    def is_last_open(self, node_id: str) -> bool:
        """Whether every other node has ended, so that ending this one ends the job."""
        return all(node.state in ENDED for other, node in self.nodes.items() if other != node_id)

    def cancel(self, now: float, reason: str = "cancelled") -> list[str]:
        """Cancel every node that has not ended; returns the ones that were running."""
        running = [n for n, r in self.nodes.items() if r.state is NodeState.RUNNING]
        for node_id, node in self.nodes.items():
            if node.state not in ENDED:
                self._end(node_id, NodeState.CANCELLED, now, reason)
        self._maybe_end(now)
        return running

    async def watch(self, from_sequence: int = 0) -> AsyncIterator[JobEvent]:
        """Events with sequence > from_sequence, live, until the job has ended."""
        async for batch in self.watch_batches(from_sequence):
            for event in batch:
                yield event

    async def watch_batches(self, from_sequence: int = 0) -> AsyncIterator[list[JobEvent]]:
        """Like `watch`, but all the events logged since the last batch at once."""
        index = from_sequence
        while True:
            if index < len(self.events):
                batch, index = self.events[index:], len(self.events)
                yield batch
            elif self.ended:
                return
            else:
                await self._changed.wait()

    def _parents_done(self, node_id: str) -> bool:
        return all(self.nodes[p].state in DONE for p in self.dag.parents[node_id])

    def _descendants(self, node_id: str) -> list[str]:
        seen: dict[str, None] = {}
        stack = list(self.dag.children[node_id])
        while stack:
            child = stack.pop()
            if child not in seen:
                seen[child] = None
                stack.extend(self.dag.children[child])
        return list(seen)

    def _release(self, node_ids: list[str], now: float) -> list[str]:
        for node_id in node_ids:
            self.nodes[node_id].ready_at = now
            self._set(node_id, NodeState.READY, now)
        return node_ids

    def _end(self, node_id: str, state: NodeState, now: float, reason: str) -> None:
        node = self.nodes[node_id]
        node.reason, node.finished_at = reason, now
        self._set(node_id, state, now, reason)

    def _set(self, node_id: str, state: NodeState, now: float, reason: str = "") -> None:
        node = self.nodes[node_id]
        previous, node.state = node.state, state
        self._emit(NodeChanged(node_id, state, previous, reason), now)

    def _maybe_end(self, now: float) -> None:
        if self.ended or any(n.state not in ENDED for n in self.nodes.values()):
            return
        states = {n.state for n in self.nodes.values()}
        if NodeState.CANCELLED in states:
            self.state = JobState.CANCELLED
        elif NodeState.FAILED in states:
            self.state = JobState.FAILED
        else:
            self.state = JobState.SUCCEEDED
        self.finished_at = now
        self._emit(JobEnded(self.state), now)

    def _emit(self, body: NodeChanged | TokensAdded | JobEnded, now: float) -> None:
        self.events.append(JobEvent(len(self.events) + 1, now, body))
        self._changed.set()
        self._changed = anyio.Event()
