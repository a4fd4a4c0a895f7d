"""Turning a rendered node prompt into token ids with the serving model's chat template.

`encode_prompt` is the reference: transformers' `apply_chat_template`. `PromptEncoder` gives the
same ids faster. A fast tokenizer first splits its input at the added tokens (`<|im_start|>`, ...)
and then tokenizes each piece between them on its own, so no token spans a split: the ids of a
text are the concatenation of its pieces' ids. The encoder renders the template (transformers,
exact), splits the text the same way and takes each piece's ids from a cache bounded in bytes
(pieces up to `MAX_CACHED_PIECE` characters, `cache_bytes` in all, least recently used out first;
one lock, since the gateway encodes in a worker thread), so the template's constant text (a
default system prompt, role headers) is tokenized once, not per call, and no tenant's large input
can fill the memory.
It does so only where the split is provably the tokenizer's own: added tokens that strip no
whitespace, match anywhere and are matched before normalisation; otherwise it falls back to
`encode_prompt`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from cachetools import LRUCache

from gateway.jobs.model import ChatMessage

Prompt = str | tuple[ChatMessage, ...]
MAX_CACHED_PIECE = 4096  # characters; longer pieces are tenant text, rarely seen twice
CACHE_BYTES = 8 << 20


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """A plain prompt is one user turn; chat messages keep their roles."""
    encoded = tokenizer.apply_chat_template(
        _messages(prompt), add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def prompt_text(prompt: Prompt) -> str:
    """The words of a prompt without the chat template (what length predictors read)."""
    return prompt if isinstance(prompt, str) else "\n".join(m.content for m in prompt)


class PromptEncoder:
    """`encode_prompt` with a per-piece cache; `__call__` returns a fresh list each time."""

    def __init__(self, tokenizer: Any, cache_bytes: int = CACHE_BYTES) -> None:
        self.tokenizer = tokenizer
        self._pieces = _piece_splitter(tokenizer)
        # piece -> (its length, its ids): the length lets the cache count the key's bytes too
        self._cache: LRUCache[str, tuple[int, tuple[int, ...]]] = LRUCache(
            cache_bytes, getsizeof=_cost
        )
        self._lock = threading.Lock()

    @property
    def cache_bytes(self) -> int:
        """What the cached pieces take, as the cache counts it."""
        with self._lock:
            return int(self._cache.currsize)

    def __call__(self, prompt: Prompt) -> list[int]:
        if self._pieces is None:
            return encode_prompt(self.tokenizer, prompt)
        text = self.tokenizer.apply_chat_template(
            _messages(prompt), add_generation_prompt=True, tokenize=False
        )
        ids: list[int] = []
        for piece in self._pieces(text):
            ids += self._piece_ids(piece)
        return ids

    def _piece_ids(self, piece: str) -> tuple[int, ...]:
        if len(piece) > MAX_CACHED_PIECE:
            return self._encode_piece(piece)
        with self._lock:
            found = self._cache.get(piece)
        if found is not None:
            return found[1]
        ids = self._encode_piece(piece)
        with self._lock:
            self._cache[piece] = (len(piece), ids)
        return ids

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        backend = self.tokenizer.backend_tokenizer
        return tuple(backend.encode(piece, add_special_tokens=False).ids)


def _cost(entry: tuple[int, tuple[int, ...]]) -> int:
    """Bytes a cached piece holds, about: its text (up to 4 bytes a character), its ids."""
    length, ids = entry
    return 128 + 4 * length + 8 * len(ids)


def _messages(prompt: Prompt) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": m.role, "content": m.content} for m in prompt]


# Pipeline parts that treat each piece alike wherever it stands (Metaspace, for one, does not:
# it may prefix only the text's first piece).
_PIECEWISE = {
    "normalizer": {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"},
    "pre_tokenizer": {"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace"},
}


def _piece_splitter(tokenizer: Any) -> Callable[[str], Iterator[str]] | None:
    """Splits text as the tokenizer does before tokenizing (added tokens stand alone, leftmost
    longest match first); None when this tokenizer's split could differ from it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.encode_special_tokens or tokenizer.split_special_tokens:
        return None
    pipeline = json.loads(backend.to_str())
    if not all(_only(pipeline[part], kinds) for part, kinds in _PIECEWISE.items()):
        return None
    added = backend.get_added_tokens_decoder().values()
    if any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added):
        return None
    contents = sorted({t.content for t in added if t.content}, key=len, reverse=True)
    if not contents:
        return lambda text: iter((text,) if text else ())
    pattern = re.compile("(" + "|".join(map(re.escape, contents)) + ")")
    return lambda text: (piece for piece in pattern.split(text) if piece)


def _only(part: dict[str, Any] | None, kinds: set[str]) -> bool:
    """Whether a pipeline part (its JSON form) is absent or made of `kinds` alone."""
    if part is None:
        return True
    if part["type"] == "Sequence":
        children = part.get("normalizers", part.get("pretokenizers", []))
        return all(_only(child, kinds) for child in children)
    return part["type"] in kinds
