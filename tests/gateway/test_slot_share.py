"""The share arithmetic alone: weighted shares of slots, who gives one up, when the knee binds."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.slot_share import KneeBinding, furthest_over, weighted_shares


def test_shares_split_the_slots_by_weight_and_a_tenant_without_one_weighs_1() -> None:
    assert weighted_shares(["a", "b", "c"], {"a": 1.0, "b": 3.0}, 10) == pytest.approx(
        {"a": 2.0, "b": 6.0, "c": 2.0}
    )
    assert weighted_shares([], {}, 10) == {}


def test_the_tenant_furthest_over_gives_a_call_only_if_it_keeps_its_share() -> None:
    share = {"h": 2.0, "m": 2.0, "l": 2.0}
    assert furthest_over(Counter(h=5, m=3, l=0), share) == "h"
    assert furthest_over(Counter(h=2, m=2), share) is None  # each would fall below its share
    assert furthest_over(Counter(), share) is None


def test_the_knee_binds_while_a_tenant_is_light_and_another_runs_past_its_share() -> None:
    def binding(
        running: Counter[str], ready: dict[str, int], idle: frozenset[str] = frozenset()
    ) -> KneeBinding:
        share = weighted_shares([*running, *ready], {}, 6)
        return KneeBinding(6, running, share, lambda t: ready.get(t, 0), idle)

    assert binding(Counter(h=12), {"l": 1}).lights() == ["l"]
    assert binding(Counter(h=4, m=4), {}).lights() == []  # none light: the full batch serves
    assert binding(Counter(h=3), {"l": 1}).lights() == []  # nobody past its share plus one
    assert binding(Counter(h=12), {"l": 1}, frozenset({"l"})).lights() == []  # held by its quota
    light = binding(Counter(h=12), {"l": 1})
    assert light.caps("h", sheddable=False) and not light.caps("l", sheddable=False)
