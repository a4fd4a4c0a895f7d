"""From a ready node to a call the engine can run: limits, sampling, prediction and the guard.

`CallPlanner.plan` applies the tenant's limits (prompt size, max_tokens ceiling, context
length), fills sampling defaults, predicts the output length and lets the anomaly guard
(OWASP LLM10, docs/ARCHITECTURE.md §7) judge it: a flagged call is capped at a tail quantile of its
prediction, reserves KV at that cap and looks more expensive to the fair-share policy (so it
yields to others), and its node ends CAPPED, with the guard's reasons, if it hits the cap. With
a refiner (a prompt model trained with the prompts' hidden states), an unflagged call asks the
engine for its hidden state, and `refine` predicts it again once it is prefilled, corrected by
what the refined calls of its tenant's kind ran against the refiner (`predictor.correction`, as
the prompt model's answers are in `HistoryPredictor`). When the error tracker turns a kind of
call conservative (as it counts a call: `overran`, `observe`), the calls of that kind planned
before and still waiting are planned again as they would be now (`widen`). Pure: no I/O, no
clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine import SamplingParams
from gateway.jobs.model import NodeSpec
from predictor.anomaly import AnomalyGuard
from predictor.base import CallFeatures
from predictor.correction import ResidualCorrection
from predictor.distribution import LengthDistribution
from predictor.error_tracker import ErrorTracker
from predictor.history import HistoryPredictor, own_key
from predictor.prompt_model import PromptModel
from tenants import TenantQuota

# a tenant's kinds of call on one model the error tracker follows apart (`tracker_key`)
KINDS_TRACKED = 32


@dataclass(frozen=True, slots=True)
class CallDefaults:
    temperature: float = 0.7
    top_p: float = 0.9
    max_model_len: int = 2048
    ignore_eos: bool = False  # benchmarks only: every call runs to its max_tokens


@dataclass(frozen=True, slots=True)
class CallPlan:
    params: SamplingParams
    features: CallFeatures
    policy_output: float  # the predicted length the policy orders by (guard penalty applied)
    reserve_output: int  # KV the engine sets aside for the output
    cap_reason: str = ""  # set when the guard capped max_tokens below what was asked
    prediction: LengthDistribution | None = None  # what the error tracker scores at the end
    conservative: bool = False  # ordered by the p90: this tenant's kind of call mispredicts
    # the refiner's own answer, before its online correction: what the correction learns from
    refined_from: LengthDistribution | None = None
    # the guard's priority penalty on policy_output, when it flagged the call (its reserve is
    # then the guard's cap)
    penalty: float | None = None

    @property
    def refinable(self) -> bool:
        """Asks the engine for its prompt's hidden state, to refine the prediction."""
        return self.params.return_hidden

    def past_p90(self, produced: int) -> bool:
        """Whether a call that has produced `produced` tokens is past its predicted p90."""
        return self.prediction is not None and produced > self.prediction.p90


def _ordered(output: float, reserve: float, penalty: float | None, cap: int) -> tuple[float, int]:
    """What the policy orders a call by and the KV it reserves, from its predicted `output` and
    `reserve`: for a call the anomaly guard flagged (`penalty`), the output penalised and the
    guard's `cap` reserved."""
    if penalty is None:
        return output, math.ceil(reserve)
    return output * penalty, cap


class CallRefused(Exception):
    """The call breaks a tenant limit; its node fails with this reason."""


class CallPlanner:
    def __init__(
        self,
        predictor: HistoryPredictor,
        guard: AnomalyGuard | None = None,
        defaults: CallDefaults | None = None,
        refiner: PromptModel | None = None,
        tracker: ErrorTracker | None = None,
    ) -> None:
        if refiner is not None and refiner.hidden_size == 0:
            raise ValueError("the refiner is a prompt-only model: it takes no hidden vector")
        self.predictor = predictor
        self.guard = guard
        self.defaults = defaults or CallDefaults()
        self.refiner = refiner
        self.refined_correction = ResidualCorrection()
        self.tracker = tracker
        # tenant and model -> the kinds of call (node names, the tenant's to choose) the error
        # tracker follows apart; later ones share one window: a tenant naming each call anew
        # would never build a streak, and would push other tenants' windows out
        self._kinds: dict[str, set[str]] = {}

    def max_tokens(self, spec: NodeSpec, quota: TenantQuota) -> int:
        return min(spec.sampling.max_tokens or quota.default_max_tokens, quota.max_tokens_ceiling)

    def plan(
        self,
        tenant_id: str,
        spec: NodeSpec,
        prompt_text: str,
        prompt_tokens: int,
        quota: TenantQuota,
        model: str = "",
        max_model_len: int | None = None,
    ) -> CallPlan:
        """Raises CallRefused when the prompt is over the tenant's or the model's limit
        (`max_model_len`, its pool's; None: the defaults')."""
        model_len = self.defaults.max_model_len if max_model_len is None else max_model_len
        max_tokens = min(self.max_tokens(spec, quota), model_len - prompt_tokens)
        limit = quota.max_prompt_tokens
        if (limit and prompt_tokens > limit) or max_tokens < 1:
            shown = limit if limit and prompt_tokens > limit else model_len
            raise CallRefused(f"prompt of {prompt_tokens} tokens exceeds the limit of {shown}")
        features = CallFeatures(tenant_id, spec.name, prompt_tokens, max_tokens, prompt_text, model)
        predicted = self.predictor.predict(features)
        policy_output, reserve, cap_reason = predicted.mean, min(predicted.p90, max_tokens), ""
        widened = self._conservative_length(features, predicted)
        conservative = widened is not None
        if widened is not None:  # its mean keeps being wrong: order by what it reserves
            policy_output = reserve = widened
        refine, penalty, cap = self.refiner is not None, None, 0
        if self.guard is not None:
            profile = self.predictor.profile(tenant_id)
            verdict = self.guard.assess(features, predicted, profile, limit or None)
            if verdict.flagged:
                refine = False  # the guard's penalty and cap stand
                penalty, cap = verdict.priority_penalty, verdict.cap_tokens
                if verdict.cap_tokens < max_tokens:
                    max_tokens = verdict.cap_tokens
                    cap_reason = f"capped at {max_tokens} tokens: " + ", ".join(verdict.reasons)
        sampling = spec.sampling
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=(
                sampling.temperature
                if sampling.temperature is not None
                else self.defaults.temperature
            ),
            top_p=sampling.top_p if sampling.top_p is not None else self.defaults.top_p,
            top_k=sampling.top_k or 0,
            seed=sampling.seed,
            stop=sampling.stop,
            return_hidden=refine,
            ignore_eos=self.defaults.ignore_eos,
        )
        policy_output, reserve_output = _ordered(policy_output, reserve, penalty, cap)
        return CallPlan(
            params,
            features,
            policy_output,
            reserve_output,
            cap_reason,
            predicted,
            conservative,
            penalty=penalty,
        )

    def expected_output(self, features: CallFeatures) -> float:
        """A node's output as its job's arrival is costed, before its call is planned: the
        predicted mean, or in conservative mode what its plan will order it by (a kind whose
        calls keep running long must not look short in its job's cost, its chain or the
        longest-job rule until each call is ready)."""
        predicted = self.predictor.predict(features)
        widened = self._conservative_length(features, predicted)
        return predicted.mean if widened is None else widened

    def observe(self, plan: CallPlan, produced: int, overran: bool = False) -> bool:
        """A call finished with `produced` tokens: history and the error tracker learn it.
        `overran`: `overran` counted it while it ran. True when its kind turned conservative
        with it: its tenant's calls still waiting are to be planned so (`widen`)."""
        self.predictor.observe(plan.features, produced)
        if plan.refined_from is not None:
            self.refined_correction.learn(own_key(plan.features), plan.refined_from, produced)
        if self.tracker is None or plan.prediction is None:
            return False
        max_tokens = plan.params.max_tokens
        cap = max_tokens if overran else None
        key = self.tracker_key(plan.features)
        return self.tracker.record(key, plan.prediction, produced, cap, max_tokens)

    def overran(self, plan: CallPlan, produced: int) -> bool:
        """A running call has produced `produced` tokens: once that is past its predicted p90
        (`CallPlan.past_p90`) the error tracker counts it. Its caller asks once it is, and
        passes `overran=True` to `observe`. True when its kind turned conservative with it, as
        for `observe`."""
        if self.tracker is None or not plan.past_p90(produced):
            return False
        return self.tracker.overrun(self.tracker_key(plan.features), plan.params.max_tokens)

    def widen(self, plan: CallPlan) -> CallPlan | None:
        """A waiting call's plan once its kind has turned conservative: ordered and reserved as
        `CallPlanner.plan` would plan it now (at its widened length; a guard's penalty and cap
        kept); None when its kind is not conservative or it was planned so already."""
        if plan.conservative or plan.prediction is None:
            return None
        widened = self._conservative_length(plan.features, plan.prediction)
        if widened is None:
            return None
        # a flagged plan's reserve is the guard's cap
        output, reserve = _ordered(widened, widened, plan.penalty, plan.reserve_output)
        return dataclasses.replace(
            plan, policy_output=output, reserve_output=reserve, conservative=True
        )

    def refine(self, plan: CallPlan, hidden: Sequence[float]) -> CallPlan:
        """The plan once the call is prefilled: its output predicted again from the prompt and
        the prompt's hidden state (the `hidden` predictor), for the policy and the reservation."""
        if self.refiner is None or not plan.refinable:
            raise ValueError("refine needs a refiner and a call planned for refinement")
        if not all(map(math.isfinite, hidden)):  # a model gone numerically wrong says nothing
            return plan
        refined = self.refiner.refine(plan.features, hidden)
        key, cap = own_key(plan.features), plan.params.max_tokens
        predicted = self.refined_correction.apply(key, refined, cap)
        output, reserve = predicted.mean, min(predicted.p90, plan.params.max_tokens)
        widened = self._conservative_length(plan.features, predicted) if plan.conservative else None
        if widened is not None:
            output = reserve = widened
        return dataclasses.replace(
            plan,
            policy_output=output,
            reserve_output=math.ceil(reserve),
            prediction=predicted,
            refined_from=refined,
        )

    def _conservative_length(
        self, features: CallFeatures, predicted: LengthDistribution
    ) -> float | None:
        """None unless the call's kind is in conservative mode; then the length to order and
        reserve it by: its p90, widened to what calls of its kind were seen to produce, within
        its max_tokens."""
        if self.tracker is None:
            return None
        widened = self.tracker.widened(self.tracker_key(features), predicted)
        return None if widened is None else min(widened, features.max_tokens)

    def tracker_key(self, features: CallFeatures) -> str:
        """The error tracker's key for a call: its tenant's kind of call (its node name) on one
        model, or, past the tenant's first KINDS_TRACKED kinds, its other kinds together."""
        tenant = f"{features.tenant_id}\x00{features.model}"
        kinds = self._kinds.setdefault(tenant, set())
        if features.node_name not in kinds and len(kinds) < KINDS_TRACKED:
            kinds.add(features.node_name)
        if features.node_name in kinds:
            return f"{tenant}\x00{features.node_name}"
        return f"{tenant}\x01"  # no kind's key: theirs hold a NUL there
