from typing import Any

import pytest

from gateway.job_run import JobEnded, JobRun, JobState, NodeChanged, NodeState, TokensAdded
from gateway.jobs.model import JobSpec, NodeSpec, SamplingSpec


def make_run(*nodes: tuple[str, tuple[str, ...]]) -> JobRun:
    specs = tuple(
        NodeSpec(
            id=n,
            prompt_template=" ".join(f"{{{{{p}.output}}}}" for p in deps) or "go",
            depends_on=deps,
        )
        for n, deps in nodes
    )
    return JobRun("job-1", "alpha", JobSpec(nodes=specs), created_at=0.0)


def test_nodes_become_ready_when_all_parents_are_done() -> None:
    run = make_run(("a", ()), ("b", ()), ("c", ("a", "b")))
    assert run.start(1.0) == ["a", "b"]
    run.mark_running("a", 3, 1.0)
    run.add_tokens("a", "alpha", (5, 6), 1.5)
    assert run.finish_node("a", NodeState.SUCCEEDED, 2.0) == []
    assert run.finish_node("b", NodeState.CAPPED, 2.5) == ["c"]
    assert run.prompt("c") == "alpha "
    assert run.finish_node("c", NodeState.SUCCEEDED, 3.0) == []
    assert run.state is JobState.SUCCEEDED and run.finished_at == 3.0


def test_a_failed_node_fails_its_descendants_and_spares_other_branches() -> None:
    run = make_run(("a", ()), ("b", ("a",)), ("c", ("b",)), ("x", ()))
    run.start(0.0)
    run.finish_node("a", NodeState.FAILED, 1.0, "prompt too long")
    assert run.nodes["b"].state is NodeState.FAILED
    assert "parent 'a'" in run.nodes["c"].reason
    assert not run.ended
    run.finish_node("x", NodeState.SUCCEEDED, 2.0)
    assert run.state is JobState.FAILED


def test_cancel_returns_running_nodes_and_ends_the_job() -> None:
    run = make_run(("a", ()), ("b", ("a",)))
    run.start(0.0)
    run.mark_running("a", 4, 0.5)
    assert run.cancel(1.0) == ["a"]
    assert run.state is JobState.CANCELLED
    assert {n.state for n in run.nodes.values()} == {NodeState.CANCELLED}
    assert run.finish_node("a", NodeState.SUCCEEDED, 2.0) == []  # too late: stays cancelled


@pytest.mark.anyio
async def test_event_log_is_gapless_for_a_watcher_and_replayable() -> None:
    run = make_run(("a", ()))
    run.start(0.0)
    watching = run.watch()
    first = await anext(watching)  # a watcher that was there before the job ended
    run.mark_running("a", 2, 0.1)
    run.add_tokens("a", "hi", (1,), 0.2)
    run.finish_node("a", NodeState.SUCCEEDED, 0.3)
    events = [first, *[e async for e in watching]]
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert isinstance(events[-1].body, JobEnded)
    assert any(isinstance(e.body, TokensAdded) for e in events)
    changes = [e.body for e in events if isinstance(e.body, NodeChanged)]
    assert [(c.previous, c.state) for c in changes] == [
        (NodeState.PENDING, NodeState.READY),
        (NodeState.READY, NodeState.RUNNING),
        (NodeState.RUNNING, NodeState.SUCCEEDED),
    ]
    # the last watcher gone, the ended node's deltas are dropped; the rest keep their numbers
    retained = [e async for e in run.watch()]
    assert retained == [e for e in events if not isinstance(e.body, TokensAdded)]
    tail = [e async for e in run.watch(from_sequence=len(events) - 1)]
    assert tail == events[-1:]


@pytest.mark.anyio
async def test_deltas_of_ended_nodes_are_dropped_past_the_byte_budget() -> None:
    run = make_run(("a", ()), ("b", ()))
    run.max_delta_bytes = 1000
    run.start(0.0)
    watching = run.watch()
    await anext(watching)  # a live watcher keeps the job's log until the job ends
    for node_id in ("a", "b"):
        run.mark_running(node_id, 2, 0.1)
    for i in range(10):
        run.add_tokens("a", "x" * 100, (i,), 0.2)
        run.add_tokens("b", "y", (i,), 0.2)
    run.finish_node("a", NodeState.SUCCEEDED, 0.3)  # over budget: a's deltas go, b's stay
    deltas = [e.body for e in run.events if isinstance(e.body, TokensAdded)]
    assert {d.node_id for d in deltas} == {"b"} and len(deltas) == 10
    assert run.nodes["a"].output == "x" * 1000
    sequences = [e.sequence for e in run.events]
    assert sequences == sorted(sequences) and sequences[-1] == run.events[-1].sequence
    await watching.aclose()


@pytest.mark.anyio
async def test_nodes_ending_one_by_one_have_their_deltas_dropped_in_few_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Running nodes' deltas stay (their watchers may read from any point): with those past the
    budget, every node's end walked the whole log and dropped little (a job of 256 nodes
    streaming 4,096 tokens each took 1.5 s of the event loop at each end). A pass now comes
    once the ended nodes' deltas are half of what is retained, and drops them."""
    run = make_run(*((f"n{i}", ()) for i in range(64)))
    run.max_delta_bytes = 1000
    run.start(0.0)
    watching = run.watch_batches()  # closed at once by aclose (a nested one is not)
    await anext(watching)  # a live watcher keeps the job's log until the job ends
    for node_id in run.nodes:
        run.mark_running(node_id, 2, 0.1)
    for k in range(20):
        for node_id in run.nodes:
            run.add_tokens(node_id, "x", (k,), 0.2)
    logged, walked = len(run.events), 0
    droppable = JobRun._droppable

    def counted(self: JobRun, event: Any) -> bool:
        nonlocal walked
        walked += 1
        return droppable(self, event)

    monkeypatch.setattr(JobRun, "_droppable", counted)
    for i, node_id in enumerate(run.nodes):
        run.finish_node(node_id, NodeState.SUCCEEDED, 0.3)
        deltas = sum(isinstance(e.body, TokensAdded) for e in run.events)
        # at most as many again as running nodes hold; the end that ends the job keeps the
        # last node's for the watcher
        assert deltas <= 2 * 20 * max(64 - i - 1, 1)
    await watching.aclose()  # the watcher gone, the ended job's deltas go
    assert walked <= 3 * logged, f"{walked} events walked for a log of {logged}"
    assert not any(isinstance(e.body, TokensAdded) for e in run.events)


@pytest.mark.anyio
async def test_events_logged_while_a_batch_is_read_come_in_the_next_batch() -> None:
    run = make_run(("a", ()))
    run.start(0.0)
    batches: list[list[int]] = []
    async for batch in run.watch_batches():
        batches.append([e.sequence for e in batch])
        if len(batches) == 1:  # the job runs and ends while its first batch is being read
            run.mark_running("a", 2, 0.1)
            run.add_tokens("a", "hi", (1,), 0.2)
            run.finish_node("a", NodeState.SUCCEEDED, 0.3)
    assert batches == [[1], list(range(2, run.events[-1].sequence + 1))]
    assert isinstance(run.events[-1].body, JobEnded)


@pytest.mark.anyio
async def test_tokens_of_an_ended_node_are_dropped() -> None:
    run = make_run(("a", ()))
    run.start(0.0)
    run.mark_running("a", 2, 0.1)
    run.add_tokens("a", "hi", (1,), 0.2)
    assert run.cancel(0.3) == ["a"]
    run.add_tokens("a", " there", (2,), 0.4)  # buffered before the abort, read after it
    assert isinstance(run.events[-1].body, JobEnded)
    assert (run.nodes["a"].output, run.nodes["a"].output_tokens) == ("hi", 1)
    assert isinstance([e async for e in run.watch()][-1].body, JobEnded)


def test_a_child_cancelled_while_its_parent_settles_stays_cancelled() -> None:
    run = make_run(("a", ()), ("b", ("a",)))
    run.start(0.0)
    run.mark_running("a", 2, 0.1)
    run.finishing.add("a")  # a's call ended; its settle is under way
    assert run.cancel(0.2) == []  # too late for a; b is cancelled
    assert not run.ended
    assert run.finish_node("a", NodeState.SUCCEEDED, 0.3) == []  # b is not released
    assert run.nodes["b"].state is NodeState.CANCELLED
    assert run.state is JobState.CANCELLED


@pytest.mark.parametrize("first", [True, False])
def test_the_first_cancel_decides_whether_calls_cut_short_are_charged(first: bool) -> None:
    """A finishing node keeps the job open, so a second cancel (a shutdown after the client's,
    or the reverse) comes while the calls the first aborted are still closing: it must not
    make them free, nor charge the tenant for the gateway's own cancel."""
    run = make_run(("a", ()), ("b", ()))
    run.start(0.0)
    run.mark_running("a", 2, 0.1)
    run.mark_running("b", 2, 0.1)
    run.finishing.add("a")
    assert run.cancel(0.2, "first", charge=first) == ["b"]
    assert not run.ended
    run.cancel(0.3, "second", charge=not first)
    assert run.charge_cut_short is first


def test_a_watcher_keeps_the_deltas_of_a_job_that_ends_while_it_reads() -> None:
    """A watch counts from its start, before it reads anything (a replica that took the job
    over reads the events before its snapshot from the journal first): the job ending meanwhile
    keeps the token deltas it has still to read, and drops them once nobody watches."""
    run = make_run(("a", ()))
    run.start(0.0)
    run.mark_running("a", 2, 0.1)
    run.add_tokens("a", "hi", (1,), 0.2)
    with run.watching():
        run.finish_node("a", NodeState.SUCCEEDED, 0.3)
        assert run.ended and any(isinstance(e.body, TokensAdded) for e in run.events)
    assert not any(isinstance(e.body, TokensAdded) for e in run.events)


def test_retained_bytes_count_every_string_the_job_holds_as_held() -> None:
    """Only templates and inputs were counted, by characters: a job whose stop strings and
    names were wide characters held a thousand times what its tenant's bound was charged."""
    wide = "\U0001f600" * 128  # 4 bytes a character as Python holds it
    sampling = SamplingSpec(stop=(wide,) * 8)
    nodes = tuple(
        NodeSpec(id=f"n{i}", prompt_template="hi", name=wide, sampling=sampling) for i in range(32)
    )
    run = JobRun("job-1", "acme", JobSpec(nodes=nodes, name=wide, idempotency_key=wide), 0.0)
    held = 4 * len(wide) * (2 + 32 * 9)  # the job's name and key, each node's name and stops
    assert run.retained_bytes() >= held
