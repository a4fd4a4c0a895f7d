"""Incremental text and stop strings, with a real byte-level tokenizer."""

from __future__ import annotations

from engine.detokenizer import Detokenizer
from tests.engine.byte_tokenizer import byte_tokenizer

TEXT = "the quick brown fox jumps over the lazy dog"


def detokenize(stop: tuple[str, ...], min_tokens: int = 0) -> tuple[str, int]:
    """The text handed out for TEXT's tokens, and how many tokens were pushed until it stopped."""
    tokenizer = byte_tokenizer()
    detok = Detokenizer(tokenizer.backend_tokenizer, stop, min_tokens)
    text, pushed = "", 0
    for token in tokenizer.encode(TEXT):
        text += detok.push(token)
        pushed += 1
        if detok.stopped:
            return text, pushed
    return text + detok.flush(), pushed


def test_text_is_cut_at_the_first_stop_string() -> None:
    assert detokenize(("fox", "dog"))[0] == "the quick brown "
    assert detokenize(("nowhere",))[0] == TEXT


def test_a_stop_string_ending_before_min_tokens_does_not_count() -> None:
    text, stopped_at = detokenize(("the",))
    assert text == ""  # TEXT opens with it
    text, pushed = detokenize(("the",), min_tokens=stopped_at + 1)
    assert text == "the quick brown fox jumps over " and pushed > stopped_at
