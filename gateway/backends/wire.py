"""The request a call becomes on a vLLM-compatible `/v1/completions`, and its finish reasons.

One streamed completion per call: the prompt as token ids (the gateway's counts are the
server's), the gateway's enforced `max_tokens`, sampling as `SamplingParams` has it,
`request_id` = the attempt's id (the call id, suffixed for a call run again: the server's logs
name the call), token ids and the usage streamed back. Fields that change the server's
behaviour only when asked (`priority`, `min_tokens`, `ignore_eos`, `top_k`, `stop_token_ids`,
`cache_salt`) are sent only when they ask for something, so a server that lacks a feature is not
refused what it need not do; `priority` goes only to a server configured for priority
scheduling (vLLM refuses a non-zero one otherwise).
Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Any

from engine import FinishReason
from gateway.backends.base import BackendCall

# The gateway's priorities are floats (a virtual finish time, lower first); vLLM's are int64.
# Scaled to thousandths so the order of calls a millisecond of virtual time apart survives.
PRIORITY_SCALE = 1000
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# vLLM's finish reasons (vllm/v1/engine FINISH_REASON_STRINGS) but `abort`, which is no finish
# (the decoder's: the call is lost); a reason not listed is an error
FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "repetition": FinishReason.STOP,  # vLLM's repetition detection ended it: a stop of its own
    "error": FinishReason.ERROR,
}


def completion_body(call: BackendCall, model: str, send_priority: bool) -> dict[str, Any]:
    """The JSON body of the call's streamed completion request."""
    params = call.params
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(call.prompt_ids),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
        "request_id": call.attempt_id or call.call_id,
        "return_token_ids": True,
    }
    optional: dict[str, Any] = {
        "top_k": params.top_k or None,
        "seed": params.seed,
        "stop": list(params.stop) or None,
        "stop_token_ids": list(params.stop_token_ids) or None,
        "min_tokens": params.min_tokens or None,
        "ignore_eos": params.ignore_eos or None,
        "cache_salt": call.cache_salt or None,
        "priority": wire_priority(call.priority) if send_priority else None,
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    return body


def wire_priority(priority: float) -> int:
    if math.isnan(priority):
        return 0
    if math.isinf(priority):
        return INT64_MAX if priority > 0 else INT64_MIN
    return min(max(round(priority * PRIORITY_SCALE), INT64_MIN), INT64_MAX)


def finish_reason(reason: str) -> FinishReason:
    return FINISH_REASONS.get(reason, FinishReason.ERROR)
