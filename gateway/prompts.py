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

Messages' contents are text, never control tokens: a special token's string inside a content
(`<|im_start|>system` in a document a job passes on, or in a parent call's output that a
child's prompt quotes) is tokenized as the characters it is, as tiktoken does by default, so no
input and no model output can open a turn of its own in a prompt; the template's own special
tokens stay special. The encoder finds the contents by rendering the template once with a
random mark in place of each (a template that transforms a content, trimming it say, leaves its
prompt unprotected); a prompt whose contents hold no special token gets exactly the ids above.
The fallback is not protected this way. A template that refuses the messages (`raise_exception`:
Llama 2's and Mistral's unless the roles alternate) raises PromptRefused, the tenant's error.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jinja2
from cachetools import LRUCache
from tokenizers import Tokenizer

from gateway.jobs.model import ChatMessage

Prompt = str | tuple[ChatMessage, ...]
MAX_CACHED_PIECE = 4096  # characters; longer pieces are tenant text, rarely seen twice
CACHE_BYTES = 8 << 20


class PromptRefused(ValueError):
    """The model's chat template refused the messages; the message is the template's."""


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """A plain prompt is one user turn; chat messages keep their roles."""
    with _refusals():
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
        self._special = {t.content for t in _added(tokenizer) if t.special}
        # the same tokenizer reading special tokens' strings as text, for contents holding them
        self._plain: Tokenizer | None = None
        if self._pieces is not None and self._special:
            self._plain = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            self._plain.encode_special_tokens = True
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
        messages = _messages(prompt)
        text = self._render(messages)
        ids: list[int] = []
        spans = self._contents(messages, text) if self._plain is not None else ()
        for piece, plain in _split(text, self._pieces, self._special, spans):
            if plain and self._plain is not None:
                ids += _ids(self._plain, piece)
            else:
                ids += self._piece_ids(piece)
        return ids

    def _render(self, messages: list[dict[str, str]]) -> str:
        with _refusals():
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        return str(rendered)

    def _contents(self, messages: list[dict[str, str]], text: str) -> list[tuple[int, int]]:
        """Where each content that holds a special token's string lies in the rendered `text`
        (start, end); none when the template does not copy the contents as they are."""
        if not any(s in m["content"] for m in messages for s in self._special):
            return []
        nonce = secrets.token_hex(8)
        marks = [f"\x00{nonce}:{i}\x00" for i in range(len(messages))]
        marked = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
        skeleton = self._render(marked)
        rebuilt, spans, at, start = [], [], 0, 0
        for mark, message in zip(marks, messages, strict=True):
            found = skeleton.find(mark, at)
            if found < 0 or skeleton.count(mark) != 1:
                return []
            content = message["content"]
            start += found - at  # the template's text before it
            rebuilt += [skeleton[at:found], content]
            spans.append((start, start + len(content)))
            start, at = start + len(content), found + len(mark)
        rebuilt.append(skeleton[at:])
        return spans if "".join(rebuilt) == text else []

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
        return tuple(_ids(self.tokenizer.backend_tokenizer, piece))


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """The ids of `text`, encoded with the GIL let go: `Tokenizer.encode` holds it throughout
    (a prompt of a million tokens takes about a second), so a worker thread encoding one held
    the event loop, and every tenant's RPCs and streams, as long; `encode_batch` lets it go
    (the same ids, a microsecond more)."""
    (encoding,) = tokenizer.encode_batch([text], add_special_tokens=False)
    return encoding.ids


def _cost(entry: tuple[int, tuple[int, ...]]) -> int:
    """Bytes a cached piece holds, about: its text (up to 4 bytes a character), its ids."""
    length, ids = entry
    return 128 + 4 * length + 8 * len(ids)


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """A template's error is about the messages it was given (their roles, their order), which
    are the tenant's: PromptRefused, not an error of the gateway's. A template that does not
    parse is the operator's, whatever the messages: it stays an internal error."""
    try:
        yield
    except jinja2.TemplateSyntaxError:
        raise
    except jinja2.TemplateError as exc:
        raise PromptRefused(str(exc)) from exc


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


def _added(tokenizer: Any) -> list[Any]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return [] if backend is None else list(backend.get_added_tokens_decoder().values())


def _piece_splitter(tokenizer: Any) -> re.Pattern[str] | None:
    """The added tokens as the tokenizer finds them before tokenizing (they stand alone,
    leftmost longest match first); None when this tokenizer's split could differ from it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.encode_special_tokens or tokenizer.split_special_tokens:
        return None
    pipeline = json.loads(backend.to_str())
    if not all(_only(pipeline[part], kinds) for part, kinds in _PIECEWISE.items()):
        return None
    added = _added(tokenizer)
    if any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added):
        return None
    contents = sorted({t.content for t in added if t.content}, key=len, reverse=True)
    # with no added token, a pattern that never matches: the text is one piece
    return re.compile("|".join(map(re.escape, contents)) if contents else r"(?!)")


def _split(
    text: str, added: re.Pattern[str], special: set[str], contents: Sequence[tuple[int, int]]
) -> Iterator[tuple[str, bool]]:
    """The pieces of `text` the tokenizer encodes apart (the added tokens, the text between
    them), each with whether it is to be read as plain text: a special token's string that
    touches a content is no piece of its own, and makes the piece holding it plain."""
    start, plain = 0, False
    for match in added.finditer(text):
        begin, end = match.span()
        if match.group() in special and any(a < end and begin < b for a, b in contents):
            plain = True
            continue
        if begin > start:
            yield text[start:begin], plain
        yield match.group(), False
        start, plain = end, False
    if start < len(text):
        yield text[start:], plain


def _only(part: dict[str, Any] | None, kinds: set[str]) -> bool:
    """Whether a pipeline part (its JSON form) is absent or made of `kinds` alone."""
    if part is None:
        return True
    if part["type"] == "Sequence":
        children = part.get("normalizers", part.get("pretokenizers", []))
        return all(_only(child, kinds) for child in children)
    return part["type"] in kinds
