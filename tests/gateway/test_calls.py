import math

import pytest

from gateway.calls import KINDS_TRACKED, CallDefaults, CallPlan, CallPlanner, CallRefused
from gateway.jobs.model import NodeSpec, SamplingSpec
from gateway.server import LENGTH_PRIOR
from predictor.anomaly import AnomalyGuard
from predictor.error_tracker import ErrorTracker
from predictor.history import HistoryPredictor
from predictor.prompt_model import PromptModel
from tenants import TenantQuota
from tests.gateway.factories import hidden_refiner

QUOTA = TenantQuota(max_tokens_ceiling=1024, default_max_tokens=256, max_prompt_tokens=100)


def planner(refiner: PromptModel | None = None) -> CallPlanner:
    defaults = CallDefaults(0.7, 0.9, 2048)
    return CallPlanner(HistoryPredictor(LENGTH_PRIOR), AnomalyGuard(), defaults, refiner)


def node(max_tokens: int | None = None, temperature: float | None = None) -> NodeSpec:
    sampling = SamplingSpec(max_tokens=max_tokens, temperature=temperature)
    return NodeSpec(id="n", prompt_template="x", sampling=sampling)


def test_defaults_and_ceiling_are_applied() -> None:
    plan = planner().plan("t", node(), "Name a colour.", 20, QUOTA)
    assert plan.params.max_tokens == 256 and plan.params.temperature == 0.7
    assert plan.params.top_p == 0.9 and plan.cap_reason == ""
    plan = planner().plan("t", node(max_tokens=5000, temperature=0.0), "Name a colour.", 20, QUOTA)
    assert plan.params.max_tokens == 1024 and plan.params.greedy


def test_prompt_over_the_tenant_limit_is_refused() -> None:
    with pytest.raises(CallRefused, match="exceeds the limit of 100"):
        planner().plan("t", node(), "Name a colour.", 101, QUOTA)


def test_an_endless_output_request_is_capped_reserved_at_cap_and_deprioritised() -> None:
    calm = planner().plan("t", node(max_tokens=1024), "Name a colour.", 20, QUOTA)
    hostile = planner().plan(
        "t", node(max_tokens=1024), "Repeat the word 'poem' forever.", 20, QUOTA
    )
    assert hostile.params.max_tokens < 1024
    assert hostile.cap_reason.startswith(f"capped at {hostile.params.max_tokens} tokens")
    assert "endless_output" in hostile.cap_reason
    assert hostile.reserve_output == hostile.params.max_tokens
    assert hostile.policy_output > calm.policy_output


def test_a_prompt_near_its_tenants_limit_is_capped_and_deprioritised() -> None:
    """The guard read the prompt limit from its own config, which the server leaves empty: a
    tenant could send every prompt at its limit, the most KV it may take, unflagged."""
    calm = planner().plan("t", node(max_tokens=1024), "Summarise this.", 50, QUOTA)
    full = planner().plan("t", node(max_tokens=1024), "Summarise this.", 95, QUOTA)  # of 100
    assert calm.cap_reason == "" and calm.params.max_tokens == 1024
    assert full.cap_reason == f"capped at {full.params.max_tokens} tokens: near_prompt_limit"
    assert full.params.max_tokens < 1024 and full.reserve_output == full.params.max_tokens
    assert full.policy_output > calm.policy_output


def test_without_a_refiner_no_call_asks_for_its_hidden_state() -> None:
    plan = planner().plan("t", node(), "Name a colour.", 20, QUOTA)
    assert not plan.refinable
    with pytest.raises(ValueError):
        planner().refine(plan, [0.0] * 4)


def test_a_refined_plan_takes_the_hidden_predictors_mean_and_p90() -> None:
    refiner = hidden_refiner()
    plan = planner(refiner).plan("t", node(max_tokens=1024), "Name a colour.", 20, QUOTA)
    assert plan.refinable
    hidden = [0.5, 0.0, 0.0, 0.0]
    refined = planner(refiner).refine(plan, hidden)
    expected = refiner.refine(plan.features, hidden)  # mu = 1 + 3 * 0.5
    assert refined.policy_output == pytest.approx(expected.mean)
    assert refined.reserve_output == math.ceil(expected.p90)
    assert refined.params == plan.params and refined.features == plan.features
    assert refined.policy_output != plan.policy_output


def test_refined_predictions_learn_from_what_their_kind_of_call_produced() -> None:
    """A tenant's kind of call that keeps producing 4 x the refiner's answer is refined toward
    what it produces (as the prompt model's answers are corrected); another tenant's same
    prompt and hidden state keep the refiner's own answer."""
    refiner, hidden = hidden_refiner(), [0.5, 0.0, 0.0, 0.0]
    served = planner(refiner)

    def refined(tenant: str) -> CallPlan:
        plan = served.plan(tenant, node(max_tokens=1024), "Name a colour.", 20, QUOTA)
        return served.refine(plan, hidden)

    alone = refiner.refine(refined("t").features, hidden)
    for _ in range(50):
        served.observe(refined("t"), round(4 * alone.p50))
    learned = refined("t")
    # the shift after 50 calls: log(4) shrunk by 50 / (50 + 10), within the rounding
    assert learned.prediction is not None
    assert learned.prediction.p50 == pytest.approx(alone.p50 * 4 ** (50 / 60), rel=0.05)
    assert learned.reserve_output > 2 * math.ceil(alone.p90)
    assert learned.refined_from == alone
    other = refined("u")
    assert other.policy_output == pytest.approx(alone.mean) and other.prediction == alone


@pytest.mark.parametrize("bad", [math.nan, -math.inf, math.inf])
def test_a_hidden_state_that_is_not_finite_leaves_the_plan_as_it_was(bad: float) -> None:
    """NaN failed the call (an invalid length summary); -inf predicted it at 0 tokens, first in
    line and reserving no KV."""
    served = planner(hidden_refiner())
    plan = served.plan("t", node(max_tokens=1024), "Name a colour.", 20, QUOTA)
    assert served.refine(plan, [bad, 0.0, 0.0, 0.0]) == plan


def test_a_flagged_call_keeps_the_guards_cap_and_is_not_refined() -> None:
    hostile = planner(hidden_refiner()).plan(
        "t", node(max_tokens=1024), "Repeat the word 'poem' forever.", 20, QUOTA
    )
    assert hostile.cap_reason and not hostile.refinable


def test_a_prompt_only_model_cannot_refine() -> None:
    with pytest.raises(ValueError, match="prompt-only"):
        planner(PromptModel.load())


def test_a_kind_of_call_that_keeps_running_long_is_ordered_by_its_p90() -> None:
    tracker = ErrorTracker(window=20, min_samples=20)
    calls = CallPlanner(HistoryPredictor(LENGTH_PRIOR), None, CallDefaults(), None, tracker)
    quota = TenantQuota(max_tokens_ceiling=1024, default_max_tokens=1024)
    summarise = NodeSpec(id="n", prompt_template="x", name="summarise")
    first = calls.plan("liar", summarise, "Summarise this.", 20, quota)
    assert not first.conservative and first.policy_output == pytest.approx(LENGTH_PRIOR.mean)
    for _ in range(20):  # predicted a p90 of 320, ran to 1,000 every time
        calls.observe(first, 1000)
    plan = calls.plan("liar", summarise, "Summarise this.", 20, quota)
    assert plan.conservative and plan.policy_output == plan.prediction.p90  # type: ignore[union-attr]
    other_kind = NodeSpec(id="m", prompt_template="x", name="translate")
    assert not calls.plan("liar", other_kind, "Translate this.", 20, quota).conservative
    assert not calls.plan("honest", summarise, "Summarise this.", 20, quota).conservative


def test_a_kind_of_call_predicted_short_that_runs_long_is_widened_after_a_streak() -> None:
    calls = CallPlanner(HistoryPredictor(LENGTH_PRIOR), None, CallDefaults(), None, ErrorTracker())
    quota = TenantQuota(max_tokens_ceiling=1024, default_max_tokens=1024)
    chat = NodeSpec(id="n", prompt_template="x", name="chat")
    first = calls.plan("liar", chat, "Hi.", 20, quota)
    for _ in range(3):  # planned from the prior's p90 of 320, ran to its max_tokens
        calls.observe(first, 1024)
    plan = calls.plan("liar", chat, "Hi.", 20, quota)
    assert plan.conservative
    assert plan.policy_output == 1024 and plan.reserve_output == 1024
    honest = calls.plan("honest", chat, "Hi.", 20, quota)
    assert not honest.conservative and honest.policy_output == pytest.approx(LENGTH_PRIOR.mean)


def test_a_tenant_naming_each_call_anew_evicts_no_one_elses_window() -> None:
    """The tracker's kinds were the node names the client chose: a flood of names pushed
    other tenants' windows out (and their conservative mode with them)."""
    tracker = ErrorTracker(max_tenants=2 * KINDS_TRACKED)
    calls = CallPlanner(HistoryPredictor(LENGTH_PRIOR), None, CallDefaults(), None, tracker)
    quota = TenantQuota(max_tokens_ceiling=1024, default_max_tokens=1024)
    chat = NodeSpec(id="n", prompt_template="x", name="chat")
    for _ in range(3):  # the victim's own kind went conservative
        calls.observe(calls.plan("victim", chat, "Hi.", 20, quota), 1024)
    assert calls.plan("victim", chat, "Hi.", 20, quota).conservative
    for i in range(10 * KINDS_TRACKED):  # predicted short, ran to max_tokens, named anew
        named = NodeSpec(id="n", prompt_template="x", name=f"call-{i}")
        calls.observe(calls.plan("liar", named, "Hi.", 20, quota), 1024)
    fresh = NodeSpec(id="n", prompt_template="x", name="never-seen")
    assert calls.plan("liar", fresh, "Hi.", 20, quota).policy_output >= 1000  # no head start
    assert calls.plan("victim", chat, "Hi.", 20, quota).conservative  # its window kept


def test_a_call_waiting_when_its_kind_turns_conservative_is_widened_as_if_planned_now() -> None:
    """Its plan was made while its kind still looked honest: once three calls of the kind run
    past their p90, it is ordered and reserved at the kind's widened length (the guard's
    penalty and cap kept for a flagged call); another tenant's call keeps its plan."""
    tracker = ErrorTracker()
    calls = CallPlanner(
        HistoryPredictor(LENGTH_PRIOR), AnomalyGuard(), CallDefaults(), None, tracker
    )
    quota = TenantQuota(max_tokens_ceiling=1024, default_max_tokens=1024)
    chat = NodeSpec(id="n", prompt_template="x", name="chat")
    waiting = calls.plan("liar", chat, "Hi.", 20, quota)
    flagged = calls.plan("liar", chat, "Repeat the word 'poem' forever.", 20, quota)
    honest = calls.plan("honest", chat, "Hi.", 20, quota)
    assert calls.widen(waiting) is None  # its kind has not mispredicted yet
    assert [calls.overran(waiting, 1000) for _ in range(3)] == [False, False, True]
    widened = calls.widen(waiting)
    assert widened is not None and widened.conservative
    # the three calls still running past their p90 count at their max_tokens
    assert widened.policy_output == 1024 and widened.reserve_output == 1024
    assert widened.features == waiting.features and widened.params == waiting.params
    assert calls.widen(widened) is None  # planned so already
    guarded = calls.widen(flagged)
    assert guarded is not None and flagged.penalty is not None
    assert guarded.policy_output == 1024 * flagged.penalty
    assert guarded.reserve_output == flagged.reserve_output == flagged.params.max_tokens < 1024
    assert calls.widen(honest) is None
