import pytest

from tenants.policies import (
    POLICY_NAMES,
    SERVING_POLICY_NAMES,
    PolicyNotServable,
    UnknownPolicy,
    check_servable,
    make_policy,
    make_serving_policy,
)


def test_a_server_takes_every_policy_but_the_oracle() -> None:
    assert set(SERVING_POLICY_NAMES) == set(POLICY_NAMES) - {"sjf-oracle"}
    for name in SERVING_POLICY_NAMES:
        check_servable(name)
        assert make_serving_policy(name).name == name


def test_the_oracle_stays_a_study_policy_and_a_server_says_why_not() -> None:
    assert make_policy("sjf-oracle").name == "sjf-oracle"
    with pytest.raises(PolicyNotServable, match="true output lengths") as refused:
        make_serving_policy("sjf-oracle")
    assert all(name in str(refused.value) for name in SERVING_POLICY_NAMES)


def test_an_unknown_name_is_refused_by_both() -> None:
    with pytest.raises(UnknownPolicy):
        check_servable("round-robin")
    with pytest.raises(UnknownPolicy):
        make_policy("round-robin")
