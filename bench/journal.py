"""What answering for a job another replica runs costs: a replica that does not own a job reads
it from the job journal for GetJob (and for WatchJob, before it follows the stream), on its one
event loop, so that time is time every tenant waits.

One job of `--nodes` parallel calls, each streaming `--tokens` tokens in deltas of `--per-delta`,
is written by its owner's journal writer (`Journaling`, snapshots as it takes them) to the Redis
at `--redis`. After every step, and once all calls but one have ended: another replica's read
of the job (`RedisJournal.load`, the latest snapshot and the events after it, and the GetJob
reply built from it) and the owner's answer from memory (the reply built from its run); at the
end, the job replayed from every event (what the read was before snapshots; median of
`--repeats`). Also how many bytes of snapshot the owner wrote, against its events' bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio

from fairgate.v1 import gateway_pb2 as pb
from gateway.gateway_protos import job_to_proto
from gateway.job_run import JobRun, NodeState
from gateway.jobs import JobSpec, NodeSpec
from gateway.journal import Batch, RedisJournal
from gateway.journal_codec import encode_event
from gateway.journaling import Journaling

TENANT = "bench"
T = TypeVar("T")


class CountingJournal(RedisJournal):
    """Counts what the owner writes: events, their bytes, and snapshot bytes."""

    events = 0
    event_bytes = 0
    snapshot_bytes = 0
    snapshots = 0

    async def append(self, batches: Sequence[Batch]) -> list[bool]:
        for batch in batches:
            self.events += len(batch.events)
            self.event_bytes += sum(len(encode_event(e)) for e in batch.events)
            self.snapshot_bytes += len(batch.snapshot)
            self.snapshots += bool(batch.snapshot)
        return await super().append(batches)


async def _no_orphan(*_: object) -> None:
    raise AssertionError("the bench's journal has no orphans")


def _unexpected(_: JobRun) -> None:
    raise AssertionError("the bench's job is neither lost nor cancelled")


async def _durable(run: JobRun, seen: int) -> int:
    """Wait until the writer has written every event the run has."""
    async for batch in run.watch_batches(seen):
        seen = batch[-1].sequence
        if seen == run.last_sequence:
            break
    return seen


async def journaled_job(
    journal: RedisJournal, nodes: int, tokens: int, per_delta: int
) -> AsyncIterator[JobRun]:
    """A job of `nodes` parallel calls run through its owner's journal writer: each call
    starts and streams `tokens` tokens `per_delta` at a time (one engine step: a delta of every
    call), then all but the last succeed. Yields the run whenever the journal holds all it has
    (after each step, and once all but the last call have ended), then ends the job (its keys
    expire after the journal's retention)."""
    spec = JobSpec(
        nodes=tuple(NodeSpec(id=f"n{i}", prompt_template="hi") for i in range(nodes)), inputs={}
    )
    run = JobRun(f"job-{uuid.uuid4().hex[:8]}", TENANT, spec, time.time())
    sent = time.monotonic()  # Journaling's clock
    owned = await journal.create(run)
    async with Journaling(journal, _no_orphan, _unexpected, _unexpected) as journaling:
        journaling.attach(owned, run, sent)
        now = run.created_at
        run.start(now)
        for node_id in run.nodes:
            run.mark_running(node_id, 16, now)
        seen = await _durable(run, 0)
        for step in range(tokens // per_delta):
            now += 0.02
            text = " word" * per_delta
            ids = tuple(range(step * per_delta, (step + 1) * per_delta))
            for node_id in run.nodes:
                run.add_tokens(node_id, text, ids, now)
            seen = await _durable(run, seen)
            yield run
        *done, last = run.nodes
        for node_id in done:
            run.finish_node(node_id, NodeState.SUCCEEDED, now)
        seen = await _durable(run, seen)
        yield run
        run.finish_node(last, NodeState.SUCCEEDED, now)
        await _durable(run, seen)


async def _read(journal: RedisJournal, job_id: str) -> tuple[JobRun, pb.Job]:
    """Another replica's GetJob: the job as the journal has it, and the reply."""
    view = await journal.load(TENANT, job_id)
    assert view is not None
    return view, job_to_proto(view)


def _replayed(view: JobRun, reply: pb.Job, run: JobRun) -> int:
    """How many events a read replayed after the snapshot, its reply checked against the
    owner's (outside the read's time)."""
    assert reply == job_to_proto(run)
    return view.last_sequence - view.log_start


async def read_elsewhere(journal: RedisJournal, run: JobRun) -> int:
    """Another replica's GetJob of the run's job, checked; how many events it replayed."""
    return _replayed(*await _read(journal, run.job_id), run)


async def _answer(run: JobRun) -> object:
    """The owner's GetJob: the reply built from its run."""
    return job_to_proto(run)


async def _replay_all(journal: RedisJournal, run: JobRun) -> object:
    """The read before snapshots: every event replayed."""
    whole = JobRun(run.job_id, TENANT, run.spec, run.created_at)
    for event in await journal.read(TENANT, run.job_id, 0):
        whole.replay(event)
    return job_to_proto(whole)


async def _timed(read: Awaitable[T]) -> tuple[float, T]:
    start = time.perf_counter()
    result = await read
    return (time.perf_counter() - start) * 1000, result


async def measure(
    url: str, nodes: int, tokens: int, per_delta: int, repeats: int
) -> dict[str, Any]:
    """The non-owner's read and the owner's answer at every moment of the job, and every
    event replayed (median of `repeats`) once the job has all its events but its end."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    journal = CountingJournal(url, "owner", lease_ttl_s=60.0, retention_s=60.0, prefix=prefix)
    reads, answers, after_snapshot = [], [], []
    try:
        async for run in journaled_job(journal, nodes, tokens, per_delta):
            read_ms, (view, reply) = await _timed(_read(journal, run.job_id))
            reads.append(read_ms)
            after_snapshot.append(_replayed(view, reply, run))
            answers.append((await _timed(_answer(run)))[0])
        replay_all = [(await _timed(_replay_all(journal, run)))[0] for _ in range(repeats)]
    finally:
        await journal.aclose()
    return {
        "events": journal.events,
        "event_bytes": journal.event_bytes,
        "snapshots": journal.snapshots,
        "snapshot_bytes": journal.snapshot_bytes,
        "read_ms": {"p50": statistics.median(reads), "max": max(reads), "last": reads[-1]},
        "owner_ms": {"p50": statistics.median(answers), "max": max(answers)},
        "max_events_after_snapshot": max(after_snapshot),
        "replay_all_ms": statistics.median(replay_all),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--per-delta", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = anyio.run(measure, args.redis, args.nodes, args.tokens, args.per_delta, args.repeats)
    read, owner = result["read_ms"], result["owner_ms"]
    print(
        f"{result['events']:,} events ({result['event_bytes']:,} bytes), "
        f"{result['snapshots']} snapshots ({result['snapshot_bytes']:,} bytes)\n"
        f"a non-owner's read, ms: p50 {read['p50']:.1f}, max {read['max']:.1f}, "
        f"at the end {read['last']:.1f} (at most {result['max_events_after_snapshot']} events "
        f"replayed after a snapshot); every event replayed at the end: "
        f"{result['replay_all_ms']:.1f}\n"
        f"the owner's answer, ms: p50 {owner['p50']:.1f}, max {owner['max']:.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
