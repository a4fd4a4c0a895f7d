"""A streamed completion's server-sent events, turned into one call's token deltas and usage.

Algorithm: httpx-sse frames the events (lines end only at CR and LF, as the standard says: a
model's text may hold U+0085, U+2028 or U+2029, which JSON leaves unescaped and `str.splitlines`
takes for line ends). `CompletionDecoder` reads each event's data as JSON: a chunk with a choice
becomes a delta (its token ids and text); the chunk with a `finish_reason` is the last one, but it
is held back until the usage chunk that follows it (choices empty, `usage` set) or the end of the
stream, so whoever sees the finished delta can also read the call's usage. The usage is the
server's when it sent one (the quota settles on it), else the token ids counted. An error event
(`{"error": {...}}`, as vLLM and fairgate send one mid-stream) ends the call as its code says
(`answer_error`: a 4xx refused, a 5xx or none lost). A stream that ends with no finish was cut:
lost; so is a call the server itself aborted (vLLM's finish reason `abort`: it stopped the
request, its client still listening), which the server answered for (it is up).
What the server sends is untrusted: a token id that is no int32 (what the gateway's protocol
carries), a text that is no string, or more tokens than the call's `max_tokens`, is a broken
stream (lost, not handed on, the tokens past `max_tokens` not counted);
the usage it reports is settled only within what the call could have made: no less than the
tokens it streamed (the tenant has those), no more than `max_tokens` (what was reserved).
Pure: events' data in, deltas out.
Invariant: exactly one delta has `finished` True, and it is the last; `usage` is set before it is
handed out; `counted <= usage.completion_tokens <= max_tokens`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine import TokenDelta
from gateway.backends.base import CallUsage
from gateway.backends.errors import BackendLost, answer_error
from gateway.backends.wire import finish_reason

DONE = "[DONE]"
ABORTED = "abort"  # a finish reason that is no finish: the call was cut short
MAX_ID = 2**31  # token ids and counts are int32 on the gateway's own protocol
_SURROGATE = re.compile("[\ud800-\udfff]")


class CompletionDecoder:
    def __init__(self, call_id: str, prompt_tokens: int, max_tokens: int) -> None:
        self.call_id = call_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.counted = 0  # token ids streamed
        self.usage: CallUsage | None = None
        self.done = False  # `[DONE]` came
        self._held: TokenDelta | None = None  # the finished delta, until the usage comes
        self._finished = False

    def feed(self, data: str) -> list[TokenDelta]:
        """The deltas one event's data makes (the held last one once the usage came)."""
        if data == DONE:
            self.done = True
            return []
        if not data:  # an event of other fields only (an id, a retry): nothing to read
            return []
        try:
            event = json.loads(data)
        except ValueError:
            raise BackendLost(
                f"call {self.call_id}: an event that is not JSON: {data[:200]!r}"
            ) from None
        try:
            return self._read(event)
        except (AttributeError, KeyError, TypeError, ValueError):  # the server's, untrusted
            raise BackendLost(
                f"call {self.call_id}: an event that is not a completion chunk: {data[:200]!r}"
            ) from None

    def _read(self, event: dict[str, Any]) -> list[TokenDelta]:
        if "error" in event:
            raise _error(self.call_id, event["error"])
        out: list[TokenDelta] = []
        for choice in event.get("choices") or ():
            delta = self._choice(choice)
            if delta is not None:
                out.append(delta)
        usage = event.get("usage")
        if usage is not None and self._finished:
            # the usage of a finished call: the truth the quota settles on
            made = _count(usage["completion_tokens"])
            self.usage = CallUsage(
                prompt_tokens=_count(usage.get("prompt_tokens", self.prompt_tokens)),
                completion_tokens=min(max(made, self.counted), self.max_tokens),
                reported=True,
            )
            out += self._release()
        return out

    def end(self) -> list[TokenDelta]:
        """The stream ended: the held last delta, or BackendLost when the call never finished."""
        if not self._finished:
            raise BackendLost(f"call {self.call_id}: the stream ended before the call finished")
        return self._release()

    def counted_usage(self) -> CallUsage:
        """The usage as far as the stream went (for a stream that broke)."""
        return CallUsage(self.prompt_tokens, self.counted, reported=False)

    def _choice(self, choice: dict[str, Any]) -> TokenDelta | None:
        if self._finished:
            raise BackendLost(f"call {self.call_id}: tokens came after the call finished")
        token_ids = [_count(t) for t in choice.get("token_ids") or ()]
        text = choice.get("text") or ""
        if not isinstance(text, str):  # handed on, it would fail the call past the backend
            raise TypeError(f"{text!r} is no text")
        if _SURROGATE.search(text):
            # JSON may escape half of a character (a server splitting a pair between events):
            # protobuf refuses such a string, and every answer about the job failed. A pair is
            # put together, a half is U+FFFD
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        streamed = self.counted + len(token_ids)
        if streamed > self.max_tokens:  # refused uncounted: what a broken stream used is counted
            raise BackendLost(
                f"call {self.call_id}: the server streamed {streamed} tokens, past its"
                f" max_tokens of {self.max_tokens}"
            )
        self.counted = streamed
        reason = choice.get("finish_reason")
        if reason is None:
            if not token_ids and not text:
                return None  # a chunk with nothing new (vLLM sends some)
            return TokenDelta(self.call_id, token_ids, text)
        if reason == ABORTED:  # the server dropped the call (not its client): it may run again
            raise BackendLost(f"call {self.call_id}: the server aborted it", answered=True)
        self._finished = True
        self._held = TokenDelta(
            self.call_id, token_ids, text, finished=True, finish_reason=finish_reason(reason)
        )
        return None

    def _release(self) -> list[TokenDelta]:
        held, self._held = self._held, None
        if held is None:
            return []
        if self.usage is None:
            self.usage = self.counted_usage()
        return [held]


def _count(value: Any) -> int:
    """A token id or a count as the server sent it: an int32 at least 0 (not a bool, a float or
    a string, which `int` would take)."""
    if type(value) is not int or not 0 <= value < MAX_ID:
        raise ValueError(f"{value!r} is no token id or count")
    return value


def _error(call_id: str, error: Any) -> Exception:
    info = error if isinstance(error, dict) else {"message": str(error)}
    code = info.get("code")
    message = f"call {call_id}: the server failed it: {info.get('message', '?')}"
    return answer_error(message, code if isinstance(code, int) else None)
