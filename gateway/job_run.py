"""One submitted job's life: node states, outputs, and the event log its watchers read.

A node is PENDING until all its parents have succeeded, then READY (its prompt can be
rendered from the job inputs and the parents' outputs), RUNNING on the engine, and ends
SUCCEEDED, CAPPED (stopped by the anomaly guard; its output still feeds dependents), FAILED or
CANCELLED. A failed node fails every descendant with a reason naming it; independent branches
run on. The job ends when every node has ended: SUCCEEDED when none failed or was cancelled.

Invariant: events get sequence numbers 1, 2, 3, ...; every state change appears in the log
exactly once, and the last event of an ended job is JobFinished. A journaled job (the redis
store, docs/REPLICAS.md) hands each event to its journal as it happens, and watchers see an
event only once the journal says it is durable (`mark_durable`): no client hears of a change
that a replica's death could undo. A detached job (its ownership lost to another replica) is
no longer watched here: its watchers stop and read on from the journal.

The log is bounded: once a node has ended, its token deltas may be dropped (its output is in
the node itself), which happens when the retained deltas pass `max_delta_bytes` while other
nodes run on, and once the job has ended and no watcher is still reading; surviving events keep
their sequence numbers, and a watch from `s` gets every retained event with sequence >= `s`.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import sys
from collections.abc import AsyncIterator, Callable, Iterator
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
MAX_DELTA_BYTES = 1 << 20  # token deltas of ended nodes kept per job before they are dropped
_EVENT_BYTES = 160  # what one event costs in memory besides its text and token ids


@dataclass(slots=True)
class NodeRun:
    spec: NodeSpec
    state: NodeState = NodeState.PENDING
    output: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    reason: str = ""
    hit_length: bool = False  # generation stopped at max_tokens rather than at a stop
    attempts: int = 0  # times it started running (each attempt reserves under its own id)
    ready_at: float | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def queue_wait(self) -> float | None:
        """From ready to running, once it ran."""
        if self.ready_at is None or self.started_at is None:
            return None
        return max(self.started_at - self.ready_at, 0.0)

    @property
    def time_to_first_token(self) -> float | None:
        if self.started_at is None or self.first_token_at is None:
            return None
        return max(self.first_token_at - self.started_at, 0.0)

    def changed(self, change: NodeChanged, now: float) -> None:
        """What a state change does to the node, live or replayed from the journal: READY
        starts an attempt afresh (a retried node's partial output is cleared), RUNNING counts
        the attempt, an end keeps its reason."""
        self.state = change.state
        if change.state is NodeState.READY:
            self.ready_at = now
            self.output, self.output_tokens = "", 0
            self.started_at = self.first_token_at = None
        elif change.state is NodeState.RUNNING:
            self.prompt_tokens, self.started_at = change.prompt_tokens, now
            self.attempts += 1
        else:
            self.reason, self.finished_at, self.hit_length = change.reason, now, change.hit_length

    def took(self, text: str, count: int, now: float) -> None:
        """Output tokens of the running attempt."""
        if self.first_token_at is None:
            self.first_token_at = now
        self.output += text
        self.output_tokens += count

    def times(self, produced: int, last_token_at: float | None = None) -> CallTimes:
        """What its call of `produced` tokens took once it ended, measured to `last_token_at`
        where given (a finished call's last tokens, known before its node ends: the settle
        after them is the quota store's time, not the backend's)."""
        end = self.finished_at if last_token_at is None else last_token_at
        run_time = tpot = None
        if end is not None and self.started_at is not None:
            run_time = max(end - self.started_at, 0.0)
        if end is not None and self.first_token_at is not None and produced >= 2:
            tpot = max(end - self.first_token_at, 0.0) / (produced - 1)
        return CallTimes(self.queue_wait, self.time_to_first_token, tpot, run_time)


@dataclass(frozen=True, slots=True)
class CallTimes:
    """How long a node's call took, in seconds (None: it never got that far): what the
    metrics, the overload monitor and the router read once it ends."""

    queue_wait: float | None  # ready to running
    ttft: float | None  # running to the first token
    tpot: float | None  # per output token after the first
    run_time: float | None  # running to its end (its last token, for one that finished)


@dataclass(frozen=True, slots=True)
class NodeChanged:
    node_id: str
    state: NodeState
    previous: NodeState
    reason: str = ""
    prompt_tokens: int = 0  # of the attempt, when it starts RUNNING
    hit_length: bool = False  # when it ends: stopped at max_tokens


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
    key_id: str = ""  # the API key that submitted it: revoking the key cancels the job
    fingerprint: str = ""  # digest of the submitted spec, for idempotency keys
    streamed: bool = False  # a RunJob or Generate created it: its last stream closing cancels it
    max_delta_bytes: int = MAX_DELTA_BYTES
    _dag: Dag | None = None
    _changed: anyio.Event = field(default_factory=anyio.Event)
    # nodes whose call has finished and is being settled: a cancel arriving meanwhile is too
    # late for them, so they end as their call did and the job ends after them
    finishing: set[str] = field(default_factory=set)
    _last_sequence: int = 0
    _delta_bytes: int = 0  # memory held by retained token deltas
    _ended_delta_bytes: int = 0  # the part of it that ended nodes' deltas hold: droppable
    _running_delta_bytes: dict[str, int] = field(default_factory=dict)  # the rest, per node
    _watchers: int = 0
    _end_state: JobState | None = None  # how a cancelled job ends once its last node has
    # the journal each event goes to (None: not journaled, every event is durable at once)
    journal: Callable[[JobRun, JobEvent], None] | None = None
    _durable: int = 0  # the last sequence watchers may see
    detached: bool = False  # another replica owns it now: nothing more is journaled from here
    # the tenant's side cancelled it (its client, its deadline, its key or account): its calls
    # cut short settle what they made; when the gateway did (shutting down, handed over), they
    # are released
    charge_cut_short: bool = False
    epoch: int = 1  # the fencing token this replica owns it under (a later owner's is higher)
    log_start: int = 0  # the log holds events after this sequence (restored from a snapshot)
    # the characters it holds (`job_chars`), counted against its tenant's limit while it runs
    # here: set by whoever admits it or takes it over
    chars: int = 0

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

    @property
    def cancelling(self) -> bool:
        """A cancel came: no node runs again (those finishing end with their calls)."""
        return self._end_state is not None

    def start(self, now: float) -> list[str]:
        """Mark the job running; returns the nodes ready at once (the roots)."""
        self.state, self.started_at = JobState.RUNNING, now
        return self._release(list(self.dag.roots()), now)

    def prompt(self, node_id: str) -> str | tuple[ChatMessage, ...]:
        """The node's rendered prompt text or chat messages, from inputs and ancestors."""
        outputs = {a: self.nodes[a].output for a in self.dag.ancestors(node_id)}
        return render_node(self.nodes[node_id].spec, self.spec.inputs, outputs)

    def mark_running(self, node_id: str, prompt_tokens: int, now: float) -> None:
        self._set(node_id, NodeState.RUNNING, now, prompt_tokens=prompt_tokens)

    def add_tokens(self, node_id: str, text: str, token_ids: tuple[int, ...], now: float) -> None:
        """Tokens of a running node; dropped once it has ended (a cancelled call's last ones)."""
        node = self.nodes[node_id]
        if node.state in ENDED:
            return
        node.took(text, len(token_ids), now)
        self._emit(TokensAdded(node_id, text, token_ids), now)

    def finish_node(
        self, node_id: str, state: NodeState, now: float, reason: str = ""
    ) -> list[str]:
        """End a node; returns the nodes this makes ready."""
        assert state in ENDED
        self.finishing.discard(node_id)
        if self.nodes[node_id].state in ENDED:
            return []
        self._set(node_id, state, now, reason)
        if state in DONE:  # a child cancelled meanwhile stays cancelled
            children = self.dag.children[node_id]
            ready = [
                c
                for c in children
                if self.nodes[c].state is NodeState.PENDING and self._parents_done(c)
            ]
            released = self._release(ready, now)
        else:
            released = []
            for child in self._descendants(node_id):
                if self.nodes[child].state not in ENDED:
                    self._set(child, NodeState.FAILED, now, f"parent {node_id!r} {state.value}")
        self._maybe_end(now)
        return released

    def retry_node(self, node_id: str, now: float, reason: str) -> None:
        """A running node whose call was lost or yielded its room runs again from its prompt:
        it is READY once more and its partial output is cleared (watchers see the state change
        first)."""
        assert self.nodes[node_id].state is NodeState.RUNNING
        self._set(node_id, NodeState.READY, now, reason)

    def is_last_open(self, node_id: str) -> bool:
        """Whether every other node has ended, so that ending this one ends the job."""
        return all(node.state in ENDED for other, node in self.nodes.items() if other != node_id)

    def cancel(
        self, now: float, reason: str = "cancelled", *, failed: bool = False, charge: bool = False
    ) -> list[str]:
        """Cancel every node that has not ended, except those `finishing`; returns the ones
        that were running. The job ends CANCELLED, or FAILED with `failed` (its deadline
        passed), at once or when its finishing nodes have ended. `charge`: see
        `charge_cut_short`; the first cancel decides it (a second one, while a finishing node
        keeps the job open, finds the calls the first aborted still closing)."""
        if self._end_state is None:
            self.charge_cut_short = charge
        running = [
            n
            for n, r in self.nodes.items()
            if r.state is NodeState.RUNNING and n not in self.finishing
        ]
        for node_id, node in self.nodes.items():
            if node.state not in ENDED and node_id not in self.finishing:
                self._set(node_id, NodeState.CANCELLED, now, reason)
        self._end_state = JobState.FAILED if failed else JobState.CANCELLED
        self._maybe_end(now)
        return running

    def replay(self, event: JobEvent) -> None:
        """Apply one event read back from the journal, as `_emit` logged it (a replica taking
        the job over, or answering for it): the state, outputs and log are as they were. A
        detached run (a view of a job another replica runs) keeps no log: nobody watches it,
        and a watch that follows the job to its end would otherwise hold all of it."""
        if event.sequence != self._last_sequence + 1:
            raise ValueError(f"{self.job_id}: event {event.sequence} after {self._last_sequence}")
        body, now = event.body, event.time
        if self.state is JobState.QUEUED:
            self.state, self.started_at = JobState.RUNNING, now
        if isinstance(body, NodeChanged):
            self.nodes[body.node_id].changed(body, now)
        elif isinstance(body, TokensAdded):
            self.nodes[body.node_id].took(body.text, len(body.token_ids), now)
        else:
            self.state, self.finished_at = body.state, now
        self._last_sequence = self._durable = event.sequence
        if not self.detached:
            self.events.append(event)

    def replayed_to(self, sequence: int) -> None:
        """The state is as of `sequence` (restored from a journal snapshot): replay goes on
        from the next event; the log holds only what is replayed after."""
        self._last_sequence = self._durable = self.log_start = sequence

    @property
    def last_sequence(self) -> int:
        return self._last_sequence

    def mark_durable(self, sequence: int) -> None:
        """The journal holds every event up to `sequence`: watchers may see them."""
        if sequence > self._durable:
            self._durable = sequence
            self.poke()

    def detach(self) -> None:
        """Another replica owns the job now: its local watchers stop (they read on from the
        journal) and nothing more is journaled from here."""
        self.detached, self.journal = True, None
        self.poke()

    def poke(self) -> None:
        """Wake every watcher (one whose stream is being closed checks why)."""
        self._changed.set()
        self._changed = anyio.Event()

    async def watch(
        self, from_sequence: int = 0, stop: Callable[[], bool] = lambda: False
    ) -> AsyncIterator[JobEvent]:
        """Retained events with sequence > from_sequence, live, until the job has ended or
        `stop()` is true at a wake-up."""
        async for batch in self.watch_batches(from_sequence, stop):
            for event in batch:
                yield event

    async def watch_batches(
        self, from_sequence: int = 0, stop: Callable[[], bool] = lambda: False
    ) -> AsyncIterator[list[JobEvent]]:
        """Like `watch`, but all the durable events logged since the last batch at once. Stops
        early when the job is detached (the caller reads on from the journal)."""
        seen = from_sequence
        with self.watching():
            while not stop() and not self.detached:
                if seen < self._durable:
                    start = bisect.bisect_right(self.events, seen, key=lambda e: e.sequence)
                    end = bisect.bisect_right(self.events, self._durable, key=lambda e: e.sequence)
                    batch, seen = self.events[start:end], self._durable
                    yield batch
                elif self.ended and seen >= self._last_sequence:
                    return
                else:
                    await self._changed.wait()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Count a watcher while the block runs: the token deltas it may still read are kept
        (once the job has ended with no watcher, its ended nodes' deltas are dropped)."""
        self._watchers += 1
        try:
            yield
        finally:
            self._watchers -= 1
            if self.ended and not self._watchers:
                self._drop_deltas()

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
            self._set(node_id, NodeState.READY, now)
        return node_ids

    def _set(
        self, node_id: str, state: NodeState, now: float, reason: str = "", prompt_tokens: int = 0
    ) -> None:
        node = self.nodes[node_id]
        hit_length = node.hit_length and state in ENDED  # the call's finish, set by its caller
        change = NodeChanged(node_id, state, node.state, reason, prompt_tokens, hit_length)
        node.changed(change, now)
        self._emit(change, now)

    def _maybe_end(self, now: float) -> None:
        if self.ended or any(n.state not in ENDED for n in self.nodes.values()):
            return
        states = {n.state for n in self.nodes.values()}
        if self._end_state is not None:
            self.state = self._end_state
        elif NodeState.CANCELLED in states:
            self.state = JobState.CANCELLED
        elif NodeState.FAILED in states:
            self.state = JobState.FAILED
        else:
            self.state = JobState.SUCCEEDED
        self.finished_at = now
        self._emit(JobEnded(self.state), now)
        if not self._watchers:
            self._drop_deltas()

    def _emit(self, body: NodeChanged | TokensAdded | JobEnded, now: float) -> None:
        self._last_sequence += 1
        event = JobEvent(self._last_sequence, now, body)
        self.events.append(event)
        if self.journal is not None:
            self.journal(self, event)
        elif not self.detached:
            self._durable = self._last_sequence
        if isinstance(body, TokensAdded):
            size = _delta_size(body)
            self._delta_bytes += size
            held = self._running_delta_bytes
            held[body.node_id] = held.get(body.node_id, 0) + size
        elif isinstance(body, NodeChanged) and body.state in ENDED:
            self._ended_delta_bytes += self._running_delta_bytes.pop(body.node_id, 0)
            # the end that ends the job leaves them to its watchers (dropped as the last one
            # leaves): a Generate's text is its deltas, and its stream had not read the last
            if self._over_budget() and not self.is_last_open(body.node_id):
                self._drop_deltas()
        self.poke()

    def retained_bytes(self) -> int:
        """About what holding the job costs: its spec, its outputs, its events and its
        retained token deltas."""
        outputs = sum(sys.getsizeof(node.output) for node in self.nodes.values())
        changes = sum(
            _EVENT_BYTES + sys.getsizeof(event.body.reason)
            for event in self.events
            if isinstance(event.body, NodeChanged)
        )
        return self.spec.held_bytes() + outputs + changes + self._delta_bytes

    def _over_budget(self) -> bool:
        """Past the budget, with at least half of the retained deltas droppable: each pass
        over the log then drops at least half of them. Were running nodes' deltas (kept: their
        watchers may read from any point) the most of it, a pass at each node's end would drop
        little and walk the whole log each time: a job of 256 nodes streaming 4,096 tokens each
        took 1.5 s of the event loop at every node's end, 400 s in all."""
        return (
            self._delta_bytes > self.max_delta_bytes
            and 2 * self._ended_delta_bytes >= self._delta_bytes
        )

    def _drop_deltas(self) -> None:
        """Drop the token deltas of ended nodes (their outputs are complete in the nodes)."""
        if not self._delta_bytes:
            return
        self.events = [e for e in self.events if not self._droppable(e)]
        self._delta_bytes -= self._ended_delta_bytes
        self._ended_delta_bytes = 0

    def _droppable(self, event: JobEvent) -> bool:
        body = event.body
        return isinstance(body, TokensAdded) and self.nodes[body.node_id].state in ENDED


def _delta_size(delta: TokensAdded) -> int:
    return _EVENT_BYTES + sys.getsizeof(delta.text) + 8 * len(delta.token_ids)
