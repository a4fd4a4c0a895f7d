"""Incremental detokenization and stop strings for one request.

Text is produced with `tokenizers`' DecodeStream (handles tokens that split a UTF-8 character),
primed with the prompt's last tokens as vLLM primes its own: a decoder that strips the first
token's leading space (SentencePiece's Metaspace, for one) would otherwise drop the space between
the prompt and the answer.
Stop strings are matched on the text so far; text is held back while its tail could still
become a stop string, so a client never sees part of one. On a match the text is cut at it.
Before `min_tokens` tokens were pushed no stop string counts: a match must end in the text of the
`min_tokens`-th token or later.
A decoder whose text is not prefix-stable (SentencePiece's ByteFallback turns a run of byte tokens
that is no valid UTF-8 into one U+FFFD per byte, rewriting what was decoded before) makes
DecodeStream raise on a token that changes its past text; the stream then restarts at that token,
as vLLM's does: the text already handed out stands, the request goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

PRIMING_TOKENS = 6  # of the prompt's, the context the first output token is decoded in
# tokenizers raises a plain Exception for it (`DecodeStreamError::InvalidPrefix`): the message is
# the only way to tell it from a real fault
INVALID_PREFIX = "Invalid prefix encountered"


class Detokenizer:
    def __init__(
        self,
        backend: Any,
        stop: tuple[str, ...] = (),
        min_tokens: int = 0,
        prompt_ids: Sequence[int] = (),
    ) -> None:
        self._backend = backend  # a tokenizers.Tokenizer
        primer = list(prompt_ids[-PRIMING_TOKENS:])
        self._stream = DecodeStream(ids=primer, skip_special_tokens=True)
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._min_tokens = min_tokens
        self._num_tokens = 0
        self._stop_from = 0  # a stop string counts only when it ends past this char of `text`
        self.text = ""  # all text decoded so far
        self._emitted = 0  # chars of `text` already handed out
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Feed one token; return the new text that is safe to emit."""
        chunk = self._step(token_id)
        if chunk:
            self.text += chunk
        self._num_tokens += 1
        if not self._stop:
            return self._take(len(self.text))
        if self._num_tokens < self._min_tokens:
            self._stop_from = len(self.text)
        elif (cut := self._find_stop()) >= 0:
            self.text = self.text[:cut]
            self.stopped = True
            return self._take(len(self.text))
        return self._take(max(len(self.text) - self._hold, self._emitted))

    def _step(self, token_id: int) -> str | None:
        try:
            chunk: str | None = self._stream.step(self._backend, token_id)
        except Exception as exc:
            if not str(exc).startswith(INVALID_PREFIX):
                raise
            # raised inside the step every request shares: a restarted stream decodes this
            # token alone, and with no prefix to contradict it cannot raise this again
            self._stream = DecodeStream(skip_special_tokens=True)
            chunk = self._stream.step(self._backend, token_id)
        return chunk

    def flush(self) -> str:
        """The text held back, once the request has finished without a stop string."""
        return self._take(len(self.text))

    def _find_stop(self) -> int:
        """Where the earliest stop string that may end the text starts; -1: none."""
        found = (
            self.text.find(s, max(self._emitted - self._hold, self._stop_from - len(s) + 1, 0))
            for s in self._stop
        )
        return min((i for i in found if i >= 0), default=-1)

    def _take(self, end: int) -> str:
        out = self.text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return out
