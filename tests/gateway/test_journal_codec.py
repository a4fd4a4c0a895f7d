"""Journal records: events read back are the events written, and a snapshot at any point of a
job's life, with the events after it replayed, gives the job exactly as replaying every event
does (each field a GetJob answer or a later replay reads); a view replays to the same state and
keeps no log."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.job_run import ENDED, JobEvent, JobRun, NodeState
from gateway.jobs import JobSpec, NodeSpec
from gateway.journal_codec import decode_event, encode_event, encode_snapshot, restore_snapshot

SPEC = JobSpec(
    nodes=(
        NodeSpec(id="a", prompt_template="hi"),
        NodeSpec(id="b", prompt_template="{{a.output}}", depends_on=("a",)),
        NodeSpec(id="c", prompt_template="yo"),
    ),
    inputs={},
)
ENDS = (NodeState.SUCCEEDED, NodeState.CAPPED, NodeState.FAILED, NodeState.CANCELLED)


def fresh() -> JobRun:
    return JobRun("job", "acme", SPEC, 1.5)


def state_of(run: JobRun) -> tuple[object, ...]:
    nodes = [
        tuple(getattr(node, f.name) for f in dataclasses.fields(node) if f.name != "spec")
        for node in run.nodes.values()
    ]
    return run.state, run.started_at, run.finished_at, run.last_sequence, nodes


@st.composite
def lived(draw: st.DrawFn) -> tuple[JobRun, list[JobEvent]]:
    """A job driven some way through a random life: calls start, stream, end and run again;
    the job may be cancelled at the end."""
    run = fresh()
    # every event as the journal gets it (the run's own log drops ended nodes' deltas)
    logged: list[JobEvent] = []
    run.journal = lambda _, event: logged.append(event)
    now = 2.0
    run.start(now)
    for _ in range(draw(st.integers(0, 24))):
        if run.ended:
            break
        now += draw(st.sampled_from((0.0, 0.25, 1 / 3)))
        open_nodes = [n for n, node in run.nodes.items() if node.state not in ENDED]
        node_id = draw(st.sampled_from(open_nodes))
        node = run.nodes[node_id]
        if node.state is NodeState.READY:
            run.mark_running(node_id, draw(st.integers(1, 50)), now)
        elif node.state is NodeState.RUNNING:
            move = draw(st.sampled_from(("tokens", "tokens", "end", "retry")))
            if move == "tokens":
                text = draw(st.text(max_size=5))
                run.add_tokens(
                    node_id, text, tuple(draw(st.lists(st.integers(0, 9), max_size=3))), now
                )
            elif move == "end":
                node.hit_length = draw(st.booleans())
                run.finish_node(
                    node_id, draw(st.sampled_from(ENDS)), now, draw(st.text(max_size=4))
                )
            else:
                run.retry_node(node_id, now, "backend lost")
    if not run.ended and draw(st.booleans()):
        run.cancel(now, "by the client")
    return run, logged


# a job's life is drawn step by step: an example may take longer than the 200 ms default on a
# machine busy with the rest of the suite, which says nothing about the codec
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lived(), st.data())
def test_a_snapshot_and_the_events_after_it_replay_as_every_event_does(
    lived: tuple[JobRun, list[JobEvent]], data: st.DataObject
) -> None:
    run, logged = lived
    events = [decode_event(e.sequence, encode_event(e)) for e in logged]
    assert events == logged
    whole, view = fresh(), fresh()
    view.detached = True  # another replica's view of the job: the same state, and no log
    for event in events:
        whole.replay(event)
        view.replay(event)
    assert state_of(whole) == state_of(run) == state_of(view)
    assert whole.events == events and view.events == []

    cut = data.draw(st.integers(0, len(events)))
    before = fresh()
    for event in events[:cut]:
        before.replay(event)
    restored = fresh()
    restore_snapshot(restored, encode_snapshot(before))
    assert state_of(restored) == state_of(before)
    for event in events[cut:]:
        restored.replay(event)
    assert state_of(restored) == state_of(whole)
    assert restored.events == events[cut:]
