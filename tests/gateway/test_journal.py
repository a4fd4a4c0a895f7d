"""The job journal on a real Redis: a job written by its owner replays as it was, another
replica's late writes are fenced off once it is taken over, a batch sent again after a lost
reply leaves no duplicate, and an idempotency key names one job across replicas."""

from __future__ import annotations

import gc
import threading
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest

from fairgate.v1 import gateway_pb2 as pb
from gateway import journal_codec
from gateway.errors import JobUnreadable, JournalUnavailable
from gateway.job_run import JobEvent, JobRun, NodeState
from gateway.jobs import JobSpec, NodeSpec
from gateway.journal import BLOCKING_READS, POOL_SIZE, Batch, KeyTaken, RedisJournal
from tests.conftest import REDIS_URL
from tests.gateway.backends.proxy import CuttableProxy, cuttable_proxy

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


def two_calls(key: str = "") -> JobSpec:
    first = NodeSpec(id="a", prompt_template="hi")
    second = NodeSpec(id="b", prompt_template="{{a.output}}!", depends_on=("a",))
    return JobSpec(nodes=(first, second), inputs={}, idempotency_key=key)


async def test_a_journaled_job_replays_as_it_ran(journals: tuple[RedisJournal, ...]) -> None:
    one, two = journals
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    owned = await one.create(run)
    run.start(101.0)
    run.mark_running("a", 7, 102.0)
    run.add_tokens("a", "hel", (1, 2), 103.0)
    run.add_tokens("a", "lo", (3,), 104.0)
    run.finish_node("a", NodeState.SUCCEEDED, 105.0)
    run.mark_running("b", 9, 106.0)
    assert await one.append([Batch(owned, run.events)]) == [True]
    view = await two.load("acme", "job-1")
    assert view is not None and view.detached
    a, b = view.nodes["a"], view.nodes["b"]
    assert (a.state, a.output, a.output_tokens, a.prompt_tokens) == (
        NodeState.SUCCEEDED,
        "hello",
        3,
        7,
    )
    assert (a.started_at, a.first_token_at, a.finished_at) == (102.0, 103.0, 105.0)
    assert (b.state, b.attempts, view.last_sequence) == (NodeState.RUNNING, 1, run.last_sequence)
    assert view.events == []  # a view keeps no log: the journal has it


async def test_a_batch_sent_again_is_written_once(journals: tuple[RedisJournal, ...]) -> None:
    one, _ = journals
    run = JobRun("job-2", "acme", two_calls(), 100.0)
    owned = await one.create(run)
    run.start(101.0)
    first = list(run.events)
    run.mark_running("a", 7, 102.0)
    assert await one.append([Batch(owned, first)]) == [True]
    assert await one.append([Batch(owned, run.events)]) == [True]  # its reply was lost
    events = await one.read("acme", "job-2", 0)
    assert [e.sequence for e in events] == [1, 2]


async def test_a_taken_over_job_fences_its_old_owner_off(
    journals: tuple[RedisJournal, ...],
) -> None:
    one, two = journals
    run = JobRun("job-3", "acme", two_calls(), 100.0)
    owned = await one.create(run)
    assert await two.claim("acme", "job-3") is None  # its lease still runs
    await one.hand_back([owned])
    claimed = await two.claim("acme", "job-3")
    assert claimed is not None
    taken, replayed, cancel_asked = claimed
    assert taken.token > owned.token and not cancel_asked and not replayed.detached
    run.start(101.0)
    assert await one.append([Batch(owned, run.events)]) == [False]
    renewed = await one.renew([owned])
    assert renewed.lost == [owned]
    assert await one.ask_cancel("acme", "job-3")
    assert (await two.renew([taken])).cancel_asked == [taken]


async def test_an_idempotency_key_names_one_job_across_replicas(
    journals: tuple[RedisJournal, ...],
) -> None:
    one, two = journals
    await one.create(JobRun("job-4", "acme", two_calls("k"), 100.0))
    with pytest.raises(KeyTaken) as taken:
        await two.create(JobRun("job-5", "acme", two_calls("k"), 100.0))
    assert taken.value.job_id == "job-4"
    assert await two.job_by_key("acme", "k") == "job-4"
    assert await two.job_by_key("other", "k") is None


async def _run_to_end(journal: RedisJournal, run: JobRun, output: str = "x") -> None:
    """Journal the job's events as a replica does, each batch as it comes."""
    owned = await journal.create(run)
    run.start(101.0)
    sent = 0
    for node in ("a", "b"):
        run.mark_running(node, 1, 102.0)
        run.add_tokens(node, output, (1,), 103.0)
        run.finish_node(node, NodeState.SUCCEEDED, 104.0)
        batch = [e for e in run.events if e.sequence > sent]
        assert await journal.append([Batch(owned, batch, run.ended)]) == [True]
        sent = run.last_sequence
    assert run.ended


async def test_a_job_read_again_keeps_its_decoded_spec_and_sees_what_came_since(
    redis_prefix: str,
) -> None:
    """A job's spec never changes, so a replica decodes it once; the rest is read each time,
    and a job the journal dropped is not found, however its spec was kept."""
    one = RedisJournal(REDIS_URL, "one", prefix=redis_prefix, max_ended_per_tenant=1)
    two = RedisJournal(REDIS_URL, "two", prefix=redis_prefix)
    try:
        run = JobRun("job-1", "acme", two_calls(), 100.0)
        owned = await one.create(run)
        run.start(101.0)
        run.mark_running("a", 7, 102.0)
        assert await one.append([Batch(owned, run.events)]) == [True]
        first = await two.load("acme", "job-1")
        assert first is not None and first.nodes["a"].state is NodeState.RUNNING
        sent = run.last_sequence
        run.finish_node("a", NodeState.SUCCEEDED, 103.0)
        assert await one.append([Batch(owned, run.events[sent:])]) == [True]
        assert await one.ask_cancel("acme", "job-1")
        again = await two.load("acme", "job-1")
        assert again is not None and again.spec is first.spec  # decoded once
        assert again.nodes["a"].state is NodeState.SUCCEEDED
        assert again.last_sequence == run.last_sequence
        claimed = await two.claim("acme", "job-1")  # its lease runs: not claimed
        assert claimed is None
        sent = run.last_sequence
        run.mark_running("b", 1, 104.0)
        run.finish_node("b", NodeState.SUCCEEDED, 105.0)
        assert await one.append([Batch(owned, run.events[sent:], run.ended)]) == [True]
        for i in (2, 3):  # ended jobs past the tenant's bound of 1 are dropped
            await _run_to_end(one, JobRun(f"job-{i}", "acme", two_calls(), 100.0))
        assert await two.load("acme", "job-1") is None
    finally:
        await one.aclose()
        await two.aclose()


@pytest.mark.parametrize("bound", ["count", "bytes"])
async def test_a_tenants_ended_jobs_are_kept_within_their_bounds(
    redis_prefix: str, bound: str
) -> None:
    """The oldest go first, with their idempotency records; the one ending now and other
    tenants' jobs stay. By count: 2 jobs; by bytes: each job holds a 20,000-character output,
    so 50,000 bytes keep 2."""
    limits = {"count": (2, 1 << 30), "bytes": (1000, 50_000)}[bound]
    journal = RedisJournal(
        REDIS_URL,
        "one",
        prefix=redis_prefix,
        max_ended_per_tenant=limits[0],
        max_ended_bytes_per_tenant=limits[1],
    )
    try:
        await _run_to_end(journal, JobRun("job-q", "quiet", two_calls("q"), 100.0), "y" * 10_000)
        for i in range(4):
            run = JobRun(f"job-{i}", "acme", two_calls(f"k{i}"), 100.0)
            await _run_to_end(journal, run, "x" * 10_000)
        kept = [await journal.load("acme", f"job-{i}") is not None for i in range(4)]
        assert kept == [False, False, True, True]
        # what a watcher of a dropped job asks before it gives up (WatchJob: NOT_FOUND)
        assert [await journal.exists("acme", f"job-{i}") for i in range(4)] == kept
        keys = [await journal.job_by_key("acme", f"k{i}") for i in range(4)]
        assert keys == [None, None, "job-2", "job-3"]
        assert await journal.load("quiet", "job-q") is not None
        assert await journal.job_by_key("quiet", "q") == "job-q"
    finally:
        await journal.aclose()


async def test_the_ending_batch_sent_again_notes_the_job_once(
    journals: tuple[RedisJournal, ...],
) -> None:
    """A batch is sent again when its reply was lost: the job's size must not count twice
    (the tenant's total would only grow, and its jobs be dropped far below the bound)."""
    one, _ = journals
    run = JobRun("job-8", "acme", two_calls(), 100.0)
    owned = await one.create(run)
    run.start(101.0)
    run.cancel(102.0, "cancelled by the client")
    assert run.ended
    for _ in range(3):
        assert await one.append([Batch(owned, run.events, True)]) == [True]
    sizes = await one._redis.hgetall(one._ended_keys("acme")[1])
    assert sizes["total"] == sizes["acme/job-8"] and int(sizes["total"]) > 0


async def test_closing_waits_for_a_read_under_way_and_leaves_no_connection(
    redis_prefix: str,
) -> None:
    """A call the close cut would reconnect to retry and hand back a connection that nothing
    closes: the close waits for it instead."""
    journal = RedisJournal(REDIS_URL, "one", prefix=redis_prefix)
    await journal.create(JobRun("job-7", "acme", two_calls(), 100.0))
    read: list[JobEvent] | None = None
    reading = anyio.Event()

    async def wait_for_events() -> None:
        nonlocal read
        reading.set()
        read = await journal.read("acme", "job-7", 10, block_s=0.3)  # nothing comes

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for_events)
        await reading.wait()
        await journal.aclose()
        assert read == []  # it ended before the close went on
    pools: list[Any] = [journal._redis.connection_pool, journal._blocking.connection_pool]
    connections = [c for p in pools for c in (*p._available_connections, *p._in_use_connections)]
    assert connections and not any(conn.is_connected for conn in connections)


async def test_a_closed_journal_refuses_instead_of_reconnecting(redis_prefix: str) -> None:
    """A task still running after the close (a gRPC handler outliving its server's stop) must
    not open a connection that nothing will close."""
    journal = RedisJournal(REDIS_URL, "one", prefix=redis_prefix)
    await journal.create(JobRun("job-6", "acme", two_calls(), 100.0))
    await journal.aclose()
    with pytest.raises(JournalUnavailable):  # redis-py alone would connect again and answer
        await journal.load("acme", "job-6")


async def test_an_idempotency_record_lasts_as_long_as_its_job(redis_prefix: str) -> None:
    """It was kept a day whatever the job's retention: once the job had gone, a submission with
    its key found the record, then no job (NOT_FOUND) until the day ran out."""
    journal = RedisJournal(REDIS_URL, "one", retention_s=60.0, prefix=redis_prefix)
    try:
        await _run_to_end(journal, JobRun("job-1", "acme", two_calls("k"), 100.0))
        record = journal._key_record("acme", "k")
        assert 0 < await journal._redis.ttl(record) <= 60
    finally:
        await journal.aclose()


async def test_a_deleted_tenants_jobs_and_keys_leave_the_journal(
    journals: tuple[RedisJournal, ...],
) -> None:
    """A tenant created again under a deleted one's id read its jobs and had its idempotency
    keys name them; the deleted tenant's open job is lost to its owner at its next renewal."""
    one, two = journals
    await _run_to_end(one, JobRun("job-1", "acme", two_calls("k"), 100.0))
    running = await one.create(JobRun("job-2", "acme", two_calls("k2"), 100.0))
    await one.create(JobRun("job-3", "acme.b", two_calls("k"), 100.0))  # a tenant beside it
    await two.forget_tenant("acme")
    assert [await two.load("acme", job) for job in ("job-1", "job-2")] == [None, None]
    assert [await two.job_by_key("acme", key) for key in ("k", "k2")] == [None, None]
    assert (await one.renew([running])).lost == [running]
    assert await two._redis.zscore(two._index, "acme/job-2") is None  # nobody may claim it
    assert await two.job_by_key("acme.b", "k") == "job-3"
    assert await two.load("acme.b", "job-3") is not None


async def test_blocking_reads_never_hold_back_renewals_and_appends(
    journals: tuple[RedisJournal, ...],
) -> None:
    """Watchers of a quiet job another replica runs each hold a connection for their XREAD's
    wait: on the pool every write shares, 64 of them (one tenant's streams) made this replica's
    renewals wait for the pool and fail, so its leases lapsed. A watcher beyond the blocking
    reads' connections waits for its turn; none fails."""
    one, two = journals
    theirs = JobRun("job-theirs", "noisy", two_calls(), 100.0)
    their_owned = await one.create(theirs)
    my_run = JobRun("job-mine", "victim", two_calls(), 100.0)
    mine = await two.create(my_run)
    watchers = 2 * max(POOL_SIZE, BLOCKING_READS)
    seen: list[list[JobEvent]] = []

    async def watch() -> None:
        seen.append(await two.read("noisy", "job-theirs", 0, block_s=30.0))

    async with anyio.create_task_group() as tg:
        for _ in range(watchers):
            tg.start_soon(watch)
        await anyio.wait_all_tasks_blocked()  # each in its XREAD, or waiting for its turn
        # behind the watchers, these waited for the pool (2 s), then failed
        assert (await two.renew([mine])).lost == []
        my_run.start(101.0)
        assert await two.append([Batch(mine, my_run.events)]) == [True]
        theirs.start(101.0)
        assert await one.append([Batch(their_owned, theirs.events)]) == [True]
    assert [[e.sequence for e in events] for events in seen] == [[1]] * watchers


async def test_an_abandoned_job_is_cancelled_and_frees_its_key(
    journals: tuple[RedisJournal, ...],
) -> None:
    """Its submitter was told it failed and retries with the key: the key named the abandoned
    job, so the retry got a job that ended cancelled. A record naming another job stays."""
    one, two = journals
    run = JobRun("job-1", "acme", two_calls("k"), 100.0)
    await one.create(run)
    await one.abandon(run)
    assert await two.job_by_key("acme", "k") is None
    claimed = await two.claim("acme", "job-1")  # handed back: claimed at once, cancelled
    assert claimed is not None and claimed[2]
    other = JobRun("job-2", "acme", two_calls("k2"), 100.0)
    await one.create(other)
    await one._redis.set(one._key_record("acme", "k2"), "job-3")  # a later job's, say
    await one.abandon(other)
    assert await two.job_by_key("acme", "k2") == "job-3"


async def test_the_decoded_spec_cache_counts_what_its_specs_hold(
    journals: tuple[RedisJournal, ...],
) -> None:
    """It counted each spec's base64 size while holding the decoded spec, ~14 times more for a
    256-node job: its 16 MiB bound let a replica reading such jobs hold over 200 MiB."""
    one, two = journals
    nodes = tuple(NodeSpec(id=f"n{i}", prompt_template="x") for i in range(256))
    spec = JobSpec(nodes=nodes, inputs={})
    for i in range(9):
        await one.create(JobRun(f"job-{i}", "acme", spec, 100.0))
    await two.load("acme", "job-0")  # the connection and the scripts: not the cache's
    counted = two._specs.currsize
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(1, 9):
            await two.load("acme", f"job-{i}")  # each read decodes a spec of its own
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0 < held <= two._specs.currsize - counted


@asynccontextmanager
async def through_proxy(redis_prefix: str) -> AsyncIterator[tuple[CuttableProxy, RedisJournal]]:
    """A replica's journal whose connections to the local Redis run through a proxy."""
    async with cuttable_proxy(urlsplit(REDIS_URL).port or 6379) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        journal = RedisJournal(url, "one", lease_ttl_s=60.0, prefix=redis_prefix)
        try:
            yield proxy, journal
        finally:
            await journal.aclose()


async def test_a_keyed_create_whose_reply_was_lost_owns_its_job(redis_prefix: str) -> None:
    """The client sends a script again when its connection drops: the create that ran finds its
    own key (it raised KeyTaken naming the job itself, which its own replica never ran)."""
    async with through_proxy(redis_prefix) as (proxy, journal):
        await journal.create(JobRun("job-0", "acme", two_calls(), 100.0))  # the script loaded
        proxy.lose_reply_to(b"acme/job-1")
        run = JobRun("job-1", "acme", two_calls("k"), 100.0)
        owned = await journal.create(run)
        assert proxy.replies_lost == 1
        run.start(101.0)
        assert await journal.append([Batch(owned, run.events)]) == [True]  # the owner's token
        with pytest.raises(KeyTaken):  # the key still names it
            await journal.create(JobRun("job-2", "acme", two_calls("k"), 100.0))


async def test_a_claim_whose_reply_was_lost_gets_the_token_it_took(
    redis_prefix: str, journals: tuple[RedisJournal, ...]
) -> None:
    """The claim that ran finds its own lease, and answers with its token (it answered None:
    the job owned by a replica that did not know it, run by nobody until its lease ran out)."""
    dead, other = journals
    await dead.hand_back([await dead.create(JobRun("job-1", "acme", two_calls(), 100.0))])
    async with through_proxy(redis_prefix) as (proxy, journal):
        assert await journal.claim("acme", "job-0") is None  # none such; the script loaded
        proxy.lose_reply_to(b"acme/job-1")
        claimed = await journal.claim("acme", "job-1")
        assert proxy.replies_lost == 1
        assert claimed is not None
        owned, _, _ = claimed
        assert (await journal.renew([owned])).lost == []
        assert await other.claim("acme", "job-1") is None  # its lease runs


def large_spec(chars: int) -> JobSpec:
    """A one-node job whose input holds `chars` characters."""
    node = NodeSpec(id="a", prompt_template="{{inputs.text}}")
    return JobSpec(nodes=(node,), inputs={"text": "x" * chars})


async def test_a_spec_holding_over_a_quarter_of_the_cache_is_not_kept_and_evicts_nothing(
    redis_prefix: str,
) -> None:
    """A spec all but filling the cache evicted every other tenant's, whose every read then
    decoded its spec again."""
    big = large_spec(100_000)
    one = RedisJournal(REDIS_URL, "one", prefix=redis_prefix)
    two = RedisJournal(REDIS_URL, "two", prefix=redis_prefix, spec_cache_bytes=big.held_bytes())
    try:
        await one.create(JobRun("job-small", "acme", two_calls(), 100.0))
        await one.create(JobRun("job-big", "bulk", big, 100.0))
        small = await two.load("acme", "job-small")
        large = await two.load("bulk", "job-big")
        small_again = await two.load("acme", "job-small")
        large_again = await two.load("bulk", "job-big")
    finally:
        await one.aclose()
        await two.aclose()
    assert small is not None and small_again is not None
    assert small_again.spec is small.spec  # kept
    assert large is not None and large_again is not None
    assert large_again.spec == large.spec and large_again.spec is not large.spec  # decoded again


async def test_a_large_spec_is_decoded_off_the_event_loop(
    journals: tuple[RedisJournal, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding a 15 MiB spec held the event loop ~50 ms: every other read, renewal and write
    of the replica waited."""
    one, two = journals
    decoded_on: list[int] = []
    from_proto = journal_codec.job_spec_from_proto

    def noted(message: pb.JobSpec) -> JobSpec:
        decoded_on.append(threading.get_ident())
        return from_proto(message)

    monkeypatch.setattr(journal_codec, "job_spec_from_proto", noted)
    spec = large_spec(100_000)  # its base64 past INLINE_DECODE_CHARS
    await one.create(JobRun("job-1", "acme", spec, 100.0))
    await one.create(JobRun("job-2", "acme", two_calls(), 100.0))
    large = await two.load("acme", "job-1")
    await two.load("acme", "job-2")
    assert large is not None and large.spec == spec
    loop = threading.get_ident()
    assert decoded_on[0] != loop  # in a worker thread
    assert decoded_on[1] == loop  # a small one where it is: a thread costs more than it


async def test_only_a_large_specs_own_decoding_makes_its_job_unreadable(
    journals: tuple[RedisJournal, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hop to the worker thread that decodes a large spec failing is no unreadable record:
    the claim raises it and the job is left as it was (it read as JobUnreadable, and the claim
    ended it FAILED, for good); a spec that cannot be decoded there still reads so."""
    one, two = journals
    await one.hand_back([await one.create(JobRun("job-1", "acme", large_spec(100_000), 100.0))])

    async def no_thread(*_: object) -> Any:
        raise RuntimeError("no worker thread")

    with monkeypatch.context() as patched:
        patched.setattr(anyio.to_thread, "run_sync", no_thread)
        with pytest.raises(RuntimeError):
            await two.load("acme", "job-1")
        with pytest.raises(RuntimeError):
            await two.claim("acme", "job-1")
    assert await one.read("acme", "job-1", 0) == []  # not ended
    key = one._job("acme", "job-1")
    spec: str = await one._redis.hget(key, "spec")  # type: ignore[assignment]
    await one._redis.hset(key, "spec", spec[:-3])  # its base64 cut short
    with pytest.raises(JobUnreadable):
        await two.load("acme", "job-1")
