"""The overload bench's pure parts: its arrivals and its summary of a run."""

from __future__ import annotations

import pytest

from bench.overload import PROTECTED, SHEDDABLE, Arrival, Outcome, arrivals, summary


def test_arrivals_follow_the_rate_and_repeat_for_a_seed() -> None:
    def ramp(t: float) -> float:
        return 10.0 + 10.0 * t / 100.0  # 10/s rising to 20/s over 100 s

    first = arrivals(ramp, 100.0, seed=3)
    assert first == arrivals(ramp, 100.0, seed=3) and first != arrivals(ramp, 100.0, seed=4)
    early = sum(1 for a in first if a.at < 50.0)
    assert len(first) == pytest.approx(1500, rel=0.1)  # the rate's integral
    assert early == pytest.approx(625, rel=0.15) and len(first) - early > early
    assert {a.tenant for a in first} == {*PROTECTED, SHEDDABLE}


def test_the_summary_counts_tokens_in_the_window_and_refusals() -> None:
    outcomes = [
        Outcome(Arrival(0.0, "gold", 3), ttft_s=0.1, tokens=[0.2, 0.3, 9.0]),
        Outcome(Arrival(0.5, "gold", 2), ttft_s=0.3, tokens=[0.8, 0.9]),
        Outcome(Arrival(1.0, "silver", 2), refused="SLO_SHED"),
        Outcome(Arrival(1.0, SHEDDABLE, 2), refused="StatusCode.UNAVAILABLE"),
    ]
    result = summary(outcomes, seconds=5.0)
    assert result["tokens_per_s"] == 4 / 5.0  # the token at 9 s came after the window
    assert (result["refused"], result["shed"]) == (2, 1)
    assert result["ttft_p99_ms"]["gold"] == pytest.approx(298.0)
    assert result["ttft_p99_ms"]["silver"] is None
