import pytest

from gateway.calls import CallDefaults, CallPlanner, CallRefused
from gateway.jobs.model import NodeSpec, SamplingSpec
from gateway.server import LENGTH_PRIOR
from predictor.anomaly import AnomalyGuard
from predictor.history import HistoryPredictor
from tenants import TenantQuota

QUOTA = TenantQuota(max_tokens_ceiling=1024, default_max_tokens=256, max_prompt_tokens=100)


def planner() -> CallPlanner:
    return CallPlanner(HistoryPredictor(LENGTH_PRIOR), AnomalyGuard(), CallDefaults(0.7, 0.9, 2048))


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
