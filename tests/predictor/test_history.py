import math
import random

import numpy as np
import pytest

from predictor.base import CallFeatures
from predictor.correction import ResidualCorrection
from predictor.distribution import LengthDistribution
from predictor.errors import InvalidCall
from predictor.history import HistoryPredictor

PRIOR = LengthDistribution.from_quantiles(100, 300, 500)


def call(
    tenant: str = "t", node: str = "n", max_tokens: int = 1000, prompt: int = 50
) -> CallFeatures:
    return CallFeatures(tenant, node, prompt_tokens=prompt, max_tokens=max_tokens)


def test_no_history_gives_the_prior_capped_at_max_tokens() -> None:
    h = HistoryPredictor(PRIOR)
    assert h.predict(call()) == PRIOR
    capped = h.predict(call(max_tokens=200))
    assert capped.p90 == 200 and capped.p99 == 200


def test_node_history_wins_once_it_has_enough_calls() -> None:
    h = HistoryPredictor(PRIOR, min_count=3)
    for n in (10, 20, 30):
        h.observe(call(node="short"), n)
    for n in (400, 500, 600):
        h.observe(call(node="long"), n)
    short, long_ = h.predict(call(node="short")), h.predict(call(node="long"))
    assert short.p50 == 20 and long_.p50 == 500
    assert short.p90 == pytest.approx(np.quantile([10, 20, 30], 0.9))


def test_fallback_goes_node_then_tenant_then_prior() -> None:
    h = HistoryPredictor(PRIOR, min_count=2)
    h.observe(call(tenant="a", node="x"), 10)
    assert h.predict(call(tenant="a", node="x")) == PRIOR  # one call is not enough anywhere
    h.observe(call(tenant="a", node="y"), 30)
    assert h.predict(call(tenant="a", node="x")).p50 == 20  # tenant a: 10 and 30
    h.observe(call(tenant="b", node="z"), 1000)
    assert h.predict(call(tenant="a", node="new")).p50 == 20
    assert h.predict(call(tenant="b", node="new")) == PRIOR  # one call of its own


def test_one_tenants_calls_never_set_anothers_predictions() -> None:
    """Past its own few calls a tenant fell back on every tenant's window: one tenant's 64 calls
    at max_tokens filled it, and each new tenant was predicted at its cap (ordered last,
    reserving all of it), or, the other way, predicted tiny."""
    h = HistoryPredictor(PRIOR)
    for _ in range(64):
        h.observe(call(tenant="loud", node="x"), 4000)
    assert h.predict(call(tenant="new", node="x")) == PRIOR


def test_mean_is_an_exponential_moving_average() -> None:
    h = HistoryPredictor(PRIOR, alpha=0.5, min_count=1)
    for n in (100, 200, 0):
        h.observe(call(), n)
    assert h.predict(call()).mean == pytest.approx(75)  # 100, then 150, then 75


def test_window_forgets_old_lengths() -> None:
    h = HistoryPredictor(PRIOR, window=4, min_count=1)
    for n in (1000, 1000, 1000, 1000, 5, 5, 5, 5):
        h.observe(call(), n)
    assert h.predict(call()).p99 == 5


def test_keys_are_bounded_per_tenant_and_one_tenants_names_never_evict_anothers() -> None:
    """Node names are free text: a tenant inventing thousands loses its own oldest, not what
    the others' calls taught (their predictions, hence their place in the fair order)."""
    h = HistoryPredictor(PRIOR, max_keys=5, max_keys_per_tenant=4, min_count=1)
    h.observe(call(tenant="quiet", node="plan"), 7)
    for i in range(50):
        h.observe(call(tenant="churn", node=f"n{i}"), i)
    assert h.predict(call(tenant="quiet", node="plan")).p50 == 7
    assert h.predict(call(tenant="churn", node="n49")).p50 == 49
    assert h.predict(call(tenant="churn", node="n0")).p50 != 0  # its own oldest went
    # churn's own key, three of its names, quiet's two
    assert len(h._stats) == 4 + 2
    for i in range(50):
        h.observe(call(tenant=f"t{i}", node="n"), i)
    # past max_keys tenants the least recently seen go whole: profile and keys
    assert h.profile("t0") is None and h.profile("t49") is not None
    assert h.predict(call(tenant="quiet", node="plan")) == PRIOR  # its keys went with it
    assert h.predict(call(tenant="t49", node="n")).p50 == 49


def test_a_call_without_node_name_uses_and_feeds_its_tenant_key_once() -> None:
    h = HistoryPredictor(PRIOR, min_count=2)
    h.observe(call(node=""), 10)
    assert h.predict(call(node="")) == PRIOR  # counted once, not twice


def test_profile_tracks_log_moments_of_prompt_and_output() -> None:
    h = HistoryPredictor(PRIOR, alpha=0.05)
    rng = random.Random(0)
    for _ in range(2000):
        h.observe(call(prompt=rng.randint(90, 110)), rng.randint(180, 220))
    profile = h.profile("t")
    assert profile is not None and profile.count == 2000
    assert profile.mean_log_output == pytest.approx(math.log1p(200), abs=0.02)
    assert profile.output_z(200) == pytest.approx(0, abs=0.3)
    assert profile.output_z(2000) > 5  # floor on std keeps the scale sane
    assert profile.prompt_z(100) == pytest.approx(0, abs=0.3)


def test_invalid_settings_and_lengths_are_refused() -> None:
    with pytest.raises(InvalidCall):
        HistoryPredictor(PRIOR, alpha=0)
    with pytest.raises(InvalidCall):
        HistoryPredictor(PRIOR).observe(call(), -1)


class FixedCold:
    """A cold-start predictor that always answers the same law and never learns."""

    def __init__(self, answer: LengthDistribution) -> None:
        self.answer, self.asked = answer, 0

    def predict(self, call: CallFeatures) -> LengthDistribution:
        self.asked += 1
        return self.answer

    def observe(self, call: CallFeatures, true_len: int) -> None:
        raise AssertionError("the history predictor does not forward observations")


def test_a_cold_model_answers_every_call_corrected_by_its_own_keys_residuals() -> None:
    cold = FixedCold(LengthDistribution.from_quantiles(100, 200, 300))
    h = HistoryPredictor(PRIOR, cold=cold, correction=ResidualCorrection(prior_calls=0))
    for n in (400, 400):
        h.observe(call(node="warm"), n)
    warm = h.predict(call(node="warm"))
    assert warm.p50 == pytest.approx(400)  # the model's answer moved by its log residual
    assert warm.p90 == pytest.approx(math.expm1(math.log1p(200) + math.log(401 / 101)))
    assert h.predict(call(node="new")) == cold.answer  # not the tenant's other node
    assert h.predict(call(tenant="u", node="warm")) == cold.answer  # nor another tenant's
    h.observe(call(node=""), 10)
    assert h.predict(call(node="")).p50 == pytest.approx(10)  # bare calls: the tenant's own
    profile = h.profile("t")  # the guard's yardstick is kept all the same
    assert profile is not None and profile.count == 3


def test_each_model_keeps_its_own_history() -> None:
    h = HistoryPredictor(PRIOR, min_count=2)
    for n in (10, 20, 30):
        h.observe(CallFeatures("t", "n", 50, 1000, model="small"), n)
    for n in (400, 500, 600):
        h.observe(CallFeatures("t", "n", 50, 1000, model="large"), n)
    assert h.predict(CallFeatures("t", "n", 50, 1000, model="small")).p50 == 20
    assert h.predict(CallFeatures("t", "n", 50, 1000, model="large")).p50 == 500
    assert h.predict(CallFeatures("u", "n", 50, 1000, model="large")) == PRIOR  # not t's


def test_corrections_are_bounded_per_tenant_and_never_evict_another_tenants() -> None:
    cold = FixedCold(LengthDistribution.from_quantiles(100, 200, 300))
    h = HistoryPredictor(PRIOR, cold=cold, correction=ResidualCorrection(max_keys_per_tenant=4))
    for _ in range(20):
        h.observe(call(tenant="quiet", node="plan"), 400)
    learned = h.predict(call(tenant="quiet", node="plan"))
    assert learned.p50 > cold.answer.p50  # it had learned something
    for i in range(50):
        h.observe(call(tenant="churn", node=f"n{i}"), 1)
    assert h.predict(call(tenant="quiet", node="plan")) == learned
    assert h.predict(call(tenant="churn", node="n0")) == cold.answer  # its own oldest went
