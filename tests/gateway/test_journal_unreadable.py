"""A job whose journal record cannot be read (a field corrupted or gone, a record of an
incompatible version, a spec this version refuses), on a real Redis: every read of it answers
JobUnreadable naming the job (it raised whatever its decoding raised: INTERNAL at the gRPC edge);
the replica claiming it ends it FAILED in the journal, so a watcher sees it end and no replica
claims it again (it was claimed, and failed, again every lease, for ever), and a take-over tick
goes on to the orphans behind it (it stopped at the unreadable one). The fields the scripts keep
(its lease, its fencing token, its last sequence, its tenant's ended jobs' sizes) are mended
where they are read."""

from __future__ import annotations

import base64
import logging

import pytest

from fairgate.v1 import gateway_pb2 as pb
from gateway.errors import JobUnreadable
from gateway.job_run import JobEnded, JobRun, JobState
from gateway.journal import Batch, Owned, RedisJournal
from gateway.journaling import Journaling
from tests.conftest import REDIS_URL
from tests.gateway.test_journal import _run_to_end, two_calls
from tests.gateway.test_journaling import no_loss

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
CYCLIC = pb.JobSpec(
    nodes=[pb.NodeSpec(id="a", depends_on=["b"]), pb.NodeSpec(id="b", depends_on=["a"])]
)
# what is written where (a field of the job's hash, or the event after its last in its log)
CORRUPTIONS = {
    "spec not base64": ("spec", "!!not base64"),
    "spec not a JobSpec": ("spec", base64.b64encode(b"\xff\xff\xff").decode()),
    "spec refused": ("spec", base64.b64encode(CYCLIC.SerializeToString()).decode()),
    "created_at": ("created_at", "yesterday"),
    "job_id gone": ("job_id", None),
    "snapshot truncated": ("snapshot", '{"q":2,"s":"running","t":[101.0'),
    "snapshot of another spec": ("snapshot", '{"q":2,"s":"running","t":[1,0],"n":[["z","ready"]]}'),
    "event of a later version": ("log", '{"t":103.0,"k":"paused"}'),
}


async def orphaned(journal: RedisJournal, job_id: str) -> int:
    """A job journaled with two events (its first call running) whose replica stopped (handed
    back: any replica may claim it at once); returns its last sequence."""
    run = JobRun(job_id, "acme", two_calls(f"key-{job_id}"), 100.0)
    owned = await journal.create(run)
    run.start(101.0)
    run.mark_running("a", 7, 102.0)
    assert await journal.append([Batch(owned, run.events)]) == [True]
    await journal.hand_back([owned])
    return run.last_sequence


async def unreadable(journal: RedisJournal, job_id: str, corruption: str) -> int:
    """An orphan, its record then corrupted with the journal's raw client; returns the job's
    last sequence."""
    last = await orphaned(journal, job_id)
    field, value = CORRUPTIONS[corruption]
    key = journal._job("acme", job_id)
    if field == "log":
        last += 1
        await journal._redis.xadd(journal._log("acme", job_id), {"e": value}, id=f"0-{last}")
        await journal._redis.hset(key, "seq", last)
    elif value is None:
        await journal._redis.hdel(key, field)
    else:
        await journal._redis.hset(key, field, value)
    return last


def taking_over(journal: RedisJournal) -> tuple[Journaling, list[str]]:
    """A replica's journaling that notes the jobs it takes over (and runs none)."""
    taken: list[str] = []

    async def take_over(owned: Owned, run: JobRun, cancel_asked: bool) -> None:
        taken.append(run.job_id)

    return Journaling(journal, take_over, no_loss, no_loss), taken


@pytest.mark.parametrize("corruption", CORRUPTIONS)
async def test_every_read_of_an_unreadable_job_says_it_cannot_be_read(
    journals: tuple[RedisJournal, RedisJournal], corruption: str
) -> None:
    dead, alive = journals  # the replica that died, one alive
    await unreadable(dead, "job-1", corruption)
    with pytest.raises(JobUnreadable, match="job-1"):
        await alive.load("acme", "job-1")  # GetJob, WatchJob, CancelJob, a key's job
    if CORRUPTIONS[corruption][0] == "log":
        with pytest.raises(JobUnreadable, match="job-1"):
            await alive.read("acme", "job-1", 0)  # a watch of its events
    else:
        assert [e.sequence for e in await alive.read("acme", "job-1", 0)] == [1, 2]
    assert await alive.job_by_key("acme", "key-job-1") == "job-1"  # it names the job still


@pytest.mark.parametrize("corruption", CORRUPTIONS)
async def test_the_claim_of_an_unreadable_job_ends_it_failed(
    journals: tuple[RedisJournal, RedisJournal], corruption: str
) -> None:
    dead, alive = journals
    last = await unreadable(dead, "job-1", corruption)
    assert await alive.claim("acme", "job-1") is None  # ended: nothing to take over
    [ended] = await alive.read("acme", "job-1", last)  # what a watcher reads next
    assert (ended.sequence, ended.body) == (last + 1, JobEnded(JobState.FAILED))
    assert await alive._redis.zscore(alive._index, "acme/job-1") is None  # nobody claims it
    assert await alive.claim("acme", "job-1") is None
    assert await alive.exists("acme", "job-1")  # kept for its retention, as any ended job


async def test_an_unreadable_job_whose_sequence_is_unreadable_too_ends_failed(
    journals: tuple[RedisJournal, RedisJournal],
) -> None:
    """Nothing could be appended to it (the append script failed on its sequence): it only
    left the open jobs, and its watchers waited for its end for ever. Its log says where it
    is."""
    dead, alive = journals
    last = await unreadable(dead, "job-1", "spec not base64")
    await dead._redis.hset(dead._job("acme", "job-1"), "seq", "many")
    assert await alive.claim("acme", "job-1") is None
    [ended] = await alive.read("acme", "job-1", last)
    assert (ended.sequence, ended.body) == (last + 1, JobEnded(JobState.FAILED))
    assert await alive._redis.zscore(alive._index, "acme/job-1") is None


async def test_a_take_over_tick_goes_past_an_unreadable_orphan(
    journals: tuple[RedisJournal, RedisJournal], caplog: pytest.LogCaptureFixture
) -> None:
    """The unreadable orphan comes first in the scan (both handed back: same lease end, then
    by name): the readable one behind it is taken over in the same tick, the unreadable one is
    ended with one log line naming it and its tenant, and the next tick finds nothing."""
    dead, alive = journals
    await unreadable(dead, "job-1", "spec not a JobSpec")
    await orphaned(dead, "job-2")
    journaling, taken = taking_over(alive)
    with caplog.at_level(logging.INFO):
        await journaling._adopt()
        await journaling._adopt()
    assert taken == ["job-2"] and journaling.owned == 1
    [line] = [r for r in caplog.records if "job-1" in r.getMessage()]
    assert line.levelno == logging.ERROR and "acme" in line.getMessage()
    assert await dead.orphans(10) == []


async def test_a_take_over_tick_goes_past_an_index_entry_that_names_no_job(
    journals: tuple[RedisJournal, RedisJournal], caplog: pytest.LogCaptureFixture
) -> None:
    """An entry of the open-jobs index that is no `<tenant>/<job>` (no script of this version
    writes one) failed every scan as it was split, on every replica at every tick, and no
    orphan was taken over any more. It leaves the index, with one log line naming it."""
    dead, alive = journals
    await orphaned(dead, "job-2")
    await dead._redis.zadd(dead._index, {"job-1": 0})  # its lease ran out: first in the scan
    journaling, taken = taking_over(alive)
    with caplog.at_level(logging.INFO):
        await journaling._adopt()
    assert taken == ["job-2"]
    assert await alive._redis.zscore(alive._index, "job-1") is None
    [line] = [r for r in caplog.records if "'job-1'" in r.getMessage()]
    assert line.levelno == logging.ERROR


async def test_a_take_over_tick_claims_an_orphan_whose_lease_cannot_be_read(
    journals: tuple[RedisJournal, RedisJournal],
) -> None:
    """The claim script failed on it (a Redis error, taken for the journal being away) before
    moving it in the index, so every tick stopped there, silently, and no orphan behind it was
    ever taken over. An unreadable lease counts as lapsed: the claim's token fences off
    whoever held it."""
    dead, alive = journals
    for job_id in ("job-1", "job-2"):
        await orphaned(dead, job_id)
    await dead._redis.hset(dead._job("acme", "job-1"), "lease_until", "soon")
    journaling, taken = taking_over(alive)
    await journaling._adopt()
    assert taken == ["job-1", "job-2"]


@pytest.mark.parametrize("token", ["x", "1.5"])
async def test_a_take_over_tick_claims_an_orphan_whose_token_cannot_be_read(
    journals: tuple[RedisJournal, RedisJournal], token: str
) -> None:
    """The claim script's increment of the token failed on it (a Redis error, taken for the
    journal being away), so every tick stopped there and no orphan behind it was taken over.
    The new token is one its old owner cannot hold: its late writes stay fenced off."""
    dead, alive = journals
    run = JobRun("job-1", "acme", two_calls(), 100.0)
    owned = await dead.create(run)
    await orphaned(dead, "job-2")
    await dead._redis.hset(dead._job("acme", "job-1"), mapping={"token": token, "lease_until": 0})
    await dead._redis.zadd(dead._index, {"acme/job-1": 0})  # its lease ran out: first in the scan
    journaling, taken = taking_over(alive)
    await journaling._adopt()
    assert taken == ["job-1", "job-2"]
    run.start(101.0)
    assert await dead.append([Batch(owned, run.events)]) == [False]


async def test_an_owner_writes_on_past_a_job_whose_sequence_cannot_be_read(
    journals: tuple[RedisJournal, RedisJournal],
) -> None:
    """The append script failed on it, and with it the whole round trip: no job of the
    replica had its events written again (each flush raised, taken for the journal being
    away). Its log's newest entry says where it is: no gap, no duplicate."""
    one, two = journals
    runs = [JobRun(f"job-{k}", "acme", two_calls(), 100.0) for k in (1, 2)]
    owned = [await one.create(run) for run in runs]
    for run in runs:
        run.start(101.0)
    started = [Batch(o, r.events) for o, r in zip(owned, runs, strict=True)]
    assert await one.append(started) == [True, True]
    await one._redis.hset(one._job("acme", "job-1"), "seq", "many")
    sent = [len(run.events) for run in runs]
    for run in runs:
        run.mark_running("a", 7, 102.0)
    batches = [Batch(o, r.events[n:]) for o, r, n in zip(owned, runs, sent, strict=True)]
    assert await one.append(batches) == [True, True]
    assert await one.append(batches) == [True, True]  # sent again: its reply was lost
    for run in runs:
        events = await two.read("acme", run.job_id, 0)
        assert [e.sequence for e in events] == list(range(1, run.last_sequence + 1))


@pytest.mark.parametrize(("size", "total"), [("big", "lots"), ("2.5", "1.5")])
async def test_an_ending_batch_writes_on_past_ended_job_sizes_that_cannot_be_read(
    redis_prefix: str, size: str, total: str
) -> None:
    """A tenant's ended jobs' sizes (a member's, their total) are read by the script that ends
    a job: one that could not be read failed it, and with it the round trip that wrote every
    job's events. The total is summed again from the members; a size that cannot be read
    counts as nothing; the tenant's ended jobs stay within their bound."""
    journal = RedisJournal(REDIS_URL, "one", prefix=redis_prefix, max_ended_per_tenant=2)
    try:
        for k in (1, 2):
            await _run_to_end(journal, JobRun(f"job-{k}", "acme", two_calls(), 100.0))
        sizes_key = journal._ended_keys("acme")[1]
        await journal._redis.hset(sizes_key, mapping={"acme/job-1": size, "total": total})
        ending, other = (JobRun(j, "acme", two_calls(), 100.0) for j in ("job-3", "job-4"))
        owned = [await journal.create(ending), await journal.create(other)]
        ending.start(101.0)
        ending.cancel(102.0, "cancelled by the client")
        other.start(101.0)
        batches = [Batch(owned[0], ending.events, True), Batch(owned[1], other.events)]
        assert await journal.append(batches) == [True, True]
        assert [await journal.exists("acme", f"job-{k}") for k in (1, 2, 3)] == [
            False,
            True,
            True,
        ]
        sizes = await journal._redis.hgetall(sizes_key)
        members = [int(v) for k, v in sizes.items() if k != "total"]
        assert len(members) == 2 and int(sizes["total"]) == sum(members)
    finally:
        await journal.aclose()
