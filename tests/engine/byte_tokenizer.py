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


def fallback_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """SentencePiece-style (Llama 2, Mistral): every byte a token of its own, decoded with
    ByteFallback (a run of byte tokens that is no valid UTF-8 becomes one U+FFFD per byte), and
    words up to `vocab_size`."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    vocab |= {f"▁w{i}": len(vocab) + i for i in range(vocab_size - len(vocab))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
