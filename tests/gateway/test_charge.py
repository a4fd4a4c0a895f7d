"""What a call's end costs its tenant (`gateway.charge`), on real job runs."""

from __future__ import annotations

from engine import FinishReason, TokenDelta
from gateway.charge import charge
from gateway.job_run import JobRun, NodeState
from gateway.jobs.model import JobSpec
from gateway.outbox import Close
from tenants.policies import ReadyCall
from tests.gateway.jobs.factories import make_node

PROMPT = 7


def running(*node_ids: str) -> JobRun:
    """A job of independent nodes, each running."""
    run = JobRun(
        "job", "acme", JobSpec(nodes=tuple(make_node(n, f"say {n}") for n in node_ids)), 0.0
    )
    run.start(0.0)
    for node_id in node_ids:
        run.mark_running(node_id, PROMPT, 0.0)
    return run


def call(node_id: str = "a") -> ReadyCall:
    return ReadyCall(f"job/{node_id}", "job", "acme", node_id, PROMPT, 10.0, 64)


def last(reason: FinishReason | None = FinishReason.STOP) -> TokenDelta:
    return TokenDelta("job/a", [1], "x", finished=reason is not None, finish_reason=reason)


def test_a_call_that_ran_to_its_end_settles_what_it_produced_and_its_jobs_finish() -> None:
    cost = charge(running("a"), call(), "q", last(), 12, "")
    assert cost.close == Close("settle", "acme", "q", PROMPT, 12, "job")
    assert cost.finished and cost.settled == 12 and cost.reason == ""


def test_a_job_with_another_open_node_is_not_finished_by_the_settle() -> None:
    cost = charge(running("a", "b"), call(), "q", last(FinishReason.LENGTH), 64, "")
    assert cost.close == Close("settle", "acme", "q", PROMPT, 64, None)


def test_the_gateways_failure_or_the_engines_error_is_released() -> None:
    for cost, reason in (
        (charge(running("a"), call(), "q", last(), 12, "backend lost"), "backend lost"),
        (charge(running("a"), call(), "q", last(FinishReason.ERROR), 12, ""), "engine error"),
    ):
        assert cost.close == Close("release", "acme", "q")
        assert not cost.finished and cost.settled is None and cost.reason == reason


def test_a_stream_that_ended_without_its_end_is_released() -> None:
    for end in (None, last(None)):
        cost = charge(running("a"), call(), "q", end, 3, "")
        assert cost.close == Close("release", "acme", "q") and not cost.finished
        assert cost.reason == "call aborted by the engine"


def test_a_tenants_cancel_settles_the_tokens_its_node_took_before_it_ended() -> None:
    run = running("a")
    run.add_tokens("a", "xyz", (1, 2, 3), 1.0)
    run.cancel(2.0, charge=True)
    assert run.nodes["a"].state is NodeState.CANCELLED
    # the engine made 5 by the time its abort landed: the client had 3
    cost = charge(run, call(), "q", last(), 5, "")
    assert cost.close == Close("settle", "acme", "q", PROMPT, 3, None)
    assert not cost.finished and cost.settled == 3


def test_a_cancel_by_the_gateway_or_before_any_token_is_released() -> None:
    gateways = running("a")
    gateways.add_tokens("a", "xyz", (1, 2, 3), 1.0)
    gateways.cancel(2.0, charge=False)
    tenants_early = running("a")
    tenants_early.cancel(2.0, charge=True)
    for run in (gateways, tenants_early):
        cost = charge(run, call(), "q", last(), 5, "")
        assert cost.close == Close("release", "acme", "q") and cost.settled is None
