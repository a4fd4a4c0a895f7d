"""A small real tokenizer for engine tests that need text: byte-level BPE on a tiny corpus."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = ["the quick brown fox jumps over the lazy dog", "summarise these notes in one line"] * 20


def byte_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """Byte-level BPE (so any text round-trips) with an `<eos>` special token."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
