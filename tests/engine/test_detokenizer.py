"""Incremental text and stop strings, with a real byte-level tokenizer."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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


def test_the_answer_is_decoded_after_the_prompt_keeping_its_leading_space() -> None:
    """A SentencePiece-style decoder strips the first token's leading space: decoded on its own,
    the answer lost the space between it and the prompt ("helloworld fox"), where vLLM, which
    decodes it after the prompt's last tokens, keeps it."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, show_progress=False)
    tokenizer.train_from_iterator(["hello world the quick brown fox"] * 20, trainer)
    prompt = tokenizer.encode("hello").ids
    answer = tokenizer.encode("hello world fox").ids[len(prompt) :]
    detok = Detokenizer(tokenizer, prompt_ids=prompt)
    assert "".join(detok.push(t) for t in answer) + detok.flush() == " world fox"
