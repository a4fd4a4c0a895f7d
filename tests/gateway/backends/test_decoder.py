"""Server-sent events of a streamed completion, into one call's deltas and usage."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine import FinishReason, TokenDelta
from gateway.backends.base import CallUsage
from gateway.backends.decoder import CompletionDecoder
from gateway.backends.errors import BackendLost, BackendRefused, answer_error


def chunk(ids: list[int], text: str = "x", reason: str | None = None) -> str:
    choice = {"index": 0, "text": text, "token_ids": ids, "finish_reason": reason}
    return json.dumps({"id": "cmpl-1", "choices": [choice]})


def usage(completion: int, prompt: int = 5) -> str:
    numbers = {"prompt_tokens": prompt, "completion_tokens": completion}
    return json.dumps({"id": "cmpl-1", "choices": [], "usage": numbers})


def feed(decoder: CompletionDecoder, *events: str) -> list[TokenDelta]:
    return [delta for event in events for delta in decoder.feed(event)]


def test_the_finish_is_held_until_the_usage_which_wins_over_the_count() -> None:
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=8)
    deltas = feed(decoder, chunk([1, 2]), chunk([3], reason="length"))
    assert [d.token_ids for d in deltas] == [[1, 2]]  # the last waits for the usage
    assert decoder.usage is None
    (last,) = decoder.feed(usage(completion=4, prompt=6))
    assert last.finished and last.finish_reason is FinishReason.LENGTH and last.token_ids == [3]
    assert decoder.usage == CallUsage(prompt_tokens=6, completion_tokens=4, reported=True)
    assert decoder.feed("[DONE]") == [] and decoder.done
    assert decoder.end() == []


def test_a_stream_that_ends_after_the_finish_without_usage_settles_on_the_count() -> None:
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=8)
    assert feed(decoder, chunk([1]), chunk([2, 3], reason="stop")) != []
    (last,) = decoder.end()
    assert last.finish_reason is FinishReason.STOP
    assert decoder.usage == CallUsage(5, 3, reported=False)


def test_an_event_without_data_and_done_make_no_delta() -> None:
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=8)
    assert decoder.feed("") == [] and not decoder.done  # an event of an id or a retry only
    assert decoder.feed("[DONE]") == [] and decoder.done


def test_a_stream_cut_before_the_finish_is_lost_and_counts_what_came() -> None:
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=8)
    feed(decoder, chunk([1, 2]))
    with pytest.raises(BackendLost, match="before the call finished"):
        decoder.end()
    assert decoder.counted_usage() == CallUsage(5, 2, reported=False)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("stop", FinishReason.STOP),
        ("length", FinishReason.LENGTH),
        ("repetition", FinishReason.STOP),
        ("error", FinishReason.ERROR),
        ("content_filter", FinishReason.ERROR),
    ],
)
def test_finish_reasons(reason: str, expected: FinishReason) -> None:
    decoder = CompletionDecoder("c", 1, 8)
    decoder.feed(chunk([1], reason=reason))
    assert decoder.end()[0].finish_reason is expected


def test_empty_chunks_make_no_delta() -> None:
    decoder = CompletionDecoder("c", 1, 8)
    assert decoder.feed(chunk([], text="")) == []
    assert decoder.feed(json.dumps({"choices": [{"index": 0, "text": "é"}]}))[0].text == "é"


@pytest.mark.parametrize(
    ("error", "raised", "answered"),
    [
        ({"message": "bad", "type": "BadRequestError", "code": 400}, BackendRefused, None),
        ({"message": "busy", "type": "RateLimitError", "code": 429}, BackendLost, False),
        (
            {"message": "engine failed", "type": "InternalServerError", "code": 500},
            BackendLost,
            True,
        ),
        (
            {"message": "shut down", "type": "ServiceUnavailableError", "code": 503},
            BackendLost,
            False,
        ),
        ({"message": "no code"}, BackendLost, True),
    ],
)
def test_an_error_event_ends_the_call_as_its_code_says(
    error: dict[str, Any], raised: type[Exception], answered: bool | None
) -> None:
    """`answered`: the server failed this call itself (it is up: the breaker ignores it)."""
    decoder = CompletionDecoder("c", 1, 8)
    decoder.feed(chunk([1]))
    with pytest.raises(raised, match=error["message"]) as ended:
        decoder.feed(json.dumps({"error": error}))
    if answered is not None:
        assert isinstance(ended.value, BackendLost)
        assert ended.value.answered is answered


@pytest.mark.parametrize(
    ("reported", "settled"),
    [(2, 3), (3, 3), (5, 5), (8, 8), (10**9, 8)],
)
def test_the_usage_is_settled_within_what_was_streamed_and_max_tokens(
    reported: int, settled: int
) -> None:
    """A server's usage once went to the quota as it said: 10**9 tokens for a 3-token call took
    the tenant's whole budget, and fewer than it streamed failed the call after its settle."""
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=8)
    feed(decoder, chunk([1, 2]), chunk([3], reason="length"))
    decoder.feed(usage(completion=reported))
    assert decoder.usage == CallUsage(5, settled, reported=True)


@pytest.mark.parametrize(
    "event",
    [
        usage(completion=-5),
        usage(completion=2**31),
        usage(completion=3, prompt=-1),
        json.dumps({"choices": [], "usage": {"completion_tokens": True}}),
        json.dumps({"choices": [], "usage": {"completion_tokens": "3"}}),
        json.dumps({"choices": [], "usage": {"completion_tokens": 3.0}}),
    ],
)
def test_a_usage_that_is_no_count_is_a_broken_stream(event: str) -> None:
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=8)
    feed(decoder, chunk([1, 2]), chunk([3], reason="length"))
    with pytest.raises(BackendLost, match="not a completion chunk"):
        decoder.feed(event)


@pytest.mark.parametrize("token", [-1, 2**31, True, "7", 7.0])
def test_a_token_id_that_is_no_int32_is_a_broken_stream(token: Any) -> None:
    # the gateway's protocol carries int32 ids: one past it failed the tenant's Generate stream
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=8)
    with pytest.raises(BackendLost, match="not a completion chunk"):
        decoder.feed(json.dumps({"choices": [{"index": 0, "text": "x", "token_ids": [1, token]}]}))


def test_more_tokens_than_max_tokens_are_a_broken_stream() -> None:
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=3)
    assert feed(decoder, chunk([1, 2]), chunk([3])) != []
    with pytest.raises(BackendLost, match="streamed 4 tokens, past its max_tokens of 3"):
        decoder.feed(chunk([4]))


def test_a_stream_past_max_tokens_counts_no_more_than_max_tokens() -> None:
    """The count of a stream that broke is what its call used (the policy's counters and the
    replicas' share are charged it): the tokens past `max_tokens` were counted before the
    chunk was refused, so one chunk of a server's could charge a 3-token call thousands."""
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=3)
    feed(decoder, chunk([1, 2]))
    with pytest.raises(BackendLost, match="past its max_tokens of 3"):
        decoder.feed(chunk(list(range(5000))))
    assert decoder.counted_usage() == CallUsage(5, 2, reported=False)


@pytest.mark.parametrize("text", [7, ["x"], {"a": "b"}, True])
def test_a_text_that_is_no_string_is_a_broken_stream(text: Any) -> None:
    # handed on, it failed the call in the dispatcher, where a string was added to it: an
    # internal error of the gateway's instead of a call the backend lost
    decoder = CompletionDecoder("c", prompt_tokens=5, max_tokens=8)
    with pytest.raises(BackendLost, match="not a completion chunk"):
        decoder.feed(json.dumps({"choices": [{"index": 0, "text": text, "token_ids": [1]}]}))


@pytest.mark.parametrize("event", ["not json", chunk([9])])
def test_garbage_or_tokens_after_the_finish_are_a_broken_stream(event: str) -> None:
    decoder = CompletionDecoder("c", 1, 8)
    decoder.feed(chunk([1], reason="length"))
    with pytest.raises(BackendLost) as lost:
        decoder.feed(event)
    assert not lost.value.answered  # a broken stream is no answer: it counts against the server


@pytest.mark.parametrize(
    ("status", "raised", "answered"),
    [
        (400, BackendRefused, None),
        (413, BackendRefused, None),
        (301, BackendLost, False),  # a redirect: the settings name the wrong URL
        (204, BackendLost, False),
        (401, BackendLost, False),  # a key the server does not take: no call sent there runs
        (403, BackendLost, False),
        (404, BackendLost, False),  # no such model (or route) there
        (429, BackendLost, False),
        (500, BackendLost, True),
        (501, BackendLost, True),
        (502, BackendLost, False),
        (None, BackendLost, True),
    ],
)
def test_an_answer_is_read_by_its_status(
    status: int | None, raised: type[Exception], answered: bool | None
) -> None:
    error = answer_error("m", status)
    assert type(error) is raised
    if isinstance(error, BackendLost):
        assert error.answered is answered


def test_half_a_character_is_a_replacement_character_and_a_pair_one_character() -> None:
    """JSON may escape half of a character (`\\ud83d`, a server that split a pair between
    events): decoded as it came, the output held a lone surrogate, which protobuf refuses, and
    every answer about the call's job failed with INTERNAL."""
    decoder = CompletionDecoder("call-1", prompt_tokens=5, max_tokens=8)
    halves = feed(decoder, chunk([1], "a\ud83d"), chunk([2], "\ude00b"), chunk([3], "\ud83d\ude00"))
    assert [d.text for d in halves] == ["a\ufffd", "\ufffdb", "\U0001f600"]
    for delta in halves:
        delta.text.encode()  # no surrogate is left
