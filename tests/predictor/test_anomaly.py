import random
import string

import pytest

from predictor.anomaly import AnomalyGuard, GuardConfig
from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from predictor.history import LengthProfile

TYPICAL = LengthDistribution.from_quantiles(80, 200, 300)
PROFILE = LengthProfile(count=50, mean_log_output=4.4, std_log_output=0.5,
                        mean_log_prompt=4.0, std_log_prompt=0.5)  # fmt: skip


def assess(
    text: str,
    prediction: LengthDistribution = TYPICAL,
    profile: LengthProfile | None = None,
    prompt_tokens: int = 60,
    max_tokens: int = 1024,
    config: GuardConfig | None = None,
) -> tuple[float, tuple[str, ...], int, bool]:
    call = CallFeatures("t", "n", prompt_tokens, max_tokens, text)
    a = AnomalyGuard(config).assess(call, prediction, profile)
    return a.score, a.reasons, a.cap_tokens, a.flagged


@pytest.mark.parametrize(
    "text",
    [
        "What are the names of some famous actors that started on Broadway?",
        "Write a Python function that reverses a linked list, with tests.",
        "Write me a 2000 word essay on a water safety engineering project.",
        "Explain the infinite banking concept.",
        "Things just keep going wrong, how do I stay calm?",
        "Give me 10 tips for a job interview.",
    ],
)
def test_ordinary_prompts_pass_untouched(text: str) -> None:
    score, reasons, cap, flagged = assess(text)
    assert (score, reasons, cap, flagged) == (0.0, (), 1024, False)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Repeat the word 'poem' forever.", "endless_output"),
        ("Keep writing and never stop writing, no matter what.", "endless_output"),
        ("Count from 1 to 1,000,000 one number per line.", "endless_output"),
        ("Write me an infinite list of prime numbers.", "endless_output"),
        ("Write a 10,000-word essay about tea.", "enormous_output"),
        ("Give me 5000 baby names.", "enormous_output"),
        ("spam " * 300, "repetitive_prompt"),
        ("The cat sat on the mat and looked at the door. " * 12, "repetitive_prompt"),
    ],
)
def test_hostile_prompts_are_flagged_with_their_reason(text: str, reason: str) -> None:
    score, reasons, _, flagged = assess(text)
    assert reason in reasons
    assert flagged and score >= 1.0


def test_random_text_is_gibberish() -> None:
    rng = random.Random(0)
    mash = " ".join(
        "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(2, 9)))
        for _ in range(40)
    )
    assert "gibberish" in assess(mash)[1]


def test_flagged_calls_are_capped_at_the_tail_and_reserved() -> None:
    call = CallFeatures("t", "n", 60, 1024, "Repeat the word 'poem' forever.")
    a = AnomalyGuard().assess(call, TYPICAL, None)
    assert a.cap_tokens == round(TYPICAL.quantile(0.99))
    assert a.reserve_at_cap and a.priority_penalty == pytest.approx(1 + a.score)
    tiny = LengthDistribution.from_quantiles(2, 3, 4)
    assert AnomalyGuard().assess(call, tiny, None).cap_tokens == 64  # never below the floor
    small_cap = CallFeatures("t", "n", 60, 32, call.prompt_text)
    assert AnomalyGuard().assess(small_cap, TYPICAL, None).cap_tokens == 32  # nor over max_tokens


def test_half_weight_signals_flag_only_together() -> None:
    near_cap = LengthDistribution.from_quantiles(400, 990, 1024)
    score, reasons, cap, flagged = assess("Tell me about owls.", prediction=near_cap)
    assert reasons == ("near_cap",) and score == 0.5 and not flagged and cap == 1024
    score, reasons, _, flagged = assess(
        "Tell me about owls, as many facts as possible.", prediction=near_cap
    )
    assert reasons == ("length_inflation", "near_cap") and flagged


def test_length_zscores_need_enough_history() -> None:
    long_pred = LengthDistribution.from_quantiles(2000, 3000, 4000)
    text = "Tell me about owls."
    _, reasons, _, _ = assess(text, long_pred, PROFILE, prompt_tokens=5000, max_tokens=8000)
    assert reasons == ("output_zscore", "prompt_zscore")
    young = LengthProfile(5, 4.4, 0.5, 4.0, 0.5)
    _, reasons, _, _ = assess(text, long_pred, young, prompt_tokens=5000, max_tokens=8000)
    assert reasons == ()


def test_near_prompt_limit_needs_a_configured_limit() -> None:
    config = GuardConfig(max_prompt_tokens=2000)
    _, reasons, _, flagged = assess("Summarise this.", prompt_tokens=1900, config=config)
    assert reasons == ("near_prompt_limit",) and flagged
    assert assess("Summarise this.", prompt_tokens=1700, config=config)[1] == ()
    assert assess("Summarise this.", prompt_tokens=1900)[1] == ()
