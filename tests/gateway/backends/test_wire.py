"""The completion request a call becomes."""

from __future__ import annotations

from typing import Any

import pytest

from engine import SamplingParams
from gateway.backends.base import BackendCall
from gateway.backends.wire import INT64_MAX, INT64_MIN, completion_body, wire_priority


def call(priority: float = 0.0, salt: str = "", **params: Any) -> BackendCall:
    return BackendCall(
        "call-7", [5, 6, 7], SamplingParams(**params), priority=priority, cache_salt=salt
    )


def test_a_plain_call_sends_only_what_asks_for_something() -> None:
    body = completion_body(call(max_tokens=9, temperature=0.5, top_p=0.9), "m", send_priority=False)
    assert body == {
        "model": "m",
        "prompt": [5, 6, 7],
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "stream": True,
        "stream_options": {"include_usage": True},
        "request_id": "call-7",
        "return_token_ids": True,
    }


def test_the_options_a_call_sets_go_along() -> None:
    params = {
        "max_tokens": 9,
        "top_k": 4,
        "seed": 11,
        "stop": ("\n\n",),
        "stop_token_ids": (2,),
        "min_tokens": 3,
        "ignore_eos": True,
    }
    body = completion_body(call(priority=1.5, salt="s", **params), "m", send_priority=True)
    assert {k: body[k] for k in ("top_k", "seed", "stop", "stop_token_ids")} == {
        "top_k": 4,
        "seed": 11,
        "stop": ["\n\n"],
        "stop_token_ids": [2],
    }
    assert (body["min_tokens"], body["ignore_eos"], body["cache_salt"]) == (3, True, "s")
    assert body["priority"] == 1500


def test_priority_goes_only_to_a_server_configured_for_it() -> None:
    assert "priority" not in completion_body(call(priority=3.0), "m", send_priority=False)


@pytest.mark.parametrize(
    ("priority", "wire"),
    [(0.0012, 1), (-2.5, -2500), (float("inf"), INT64_MAX), (-1e300, INT64_MIN), (float("nan"), 0)],
)
def test_priorities_keep_their_order_within_int64(priority: float, wire: int) -> None:
    assert wire_priority(priority) == wire
