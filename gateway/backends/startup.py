"""The start-up check: is the server the one the settings describe?

The gateway encodes prompts with a local tokenizer and sends token ids, so a server that serves
another model, or the same model with another tokenizer, would run garbage without a word. So,
before a backend takes calls: `/v1/models` must list the configured model (its `max_model_len`
is read from there), and the server's tokenization of a probe text (`POST /tokenize`, vLLM's
route, also served by `fairgate engine serve`) must equal the local tokenizer's, token for token.
The probe mixes words, digits, punctuation, whitespace runs and multi-byte characters, where
tokenizers of one family still tend to differ. Special tokens are left out of both sides: the
gateway's prompts carry them through the chat template, whose text both sides then encode alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.backends.errors import BackendMismatch, BackendUnreachable

PROBE = "fairgate probe: The quick brown fox, 1234567 jumps — über naïve café 東京 🦊!\n\t  end"


@dataclass(frozen=True, slots=True)
class ServerInfo:
    model: str
    max_model_len: int


async def check_server(
    client: httpx.AsyncClient, backend: str, model: str, tokenizer_dir: Path, tokenizer: Any
) -> ServerInfo:
    """The server's model card; BackendMismatch when it is not what the settings say,
    BackendUnreachable when it cannot be asked. `tokenizer` is the one loaded from
    `tokenizer_dir` (the pool's: loaded once for all the backends that serve its model)."""
    models = await _get_json(client, backend, "GET", "/v1/models")
    with _reading(backend, "GET /v1/models"):
        cards = {card["id"]: card for card in models["data"]}
    if model not in cards:
        raise BackendMismatch(
            f"backend {backend}: the server serves {sorted(map(str, cards))}, not {model!r}"
        )
    with _reading(backend, "GET /v1/models"):
        max_model_len = _length(cards[model]["max_model_len"])
    tokenized = await _get_json(
        client,
        backend,
        "POST",
        "/tokenize",
        {"model": model, "prompt": PROBE, "add_special_tokens": False},
    )
    local = list(tokenizer.encode(PROBE, add_special_tokens=False))
    with _reading(backend, "POST /tokenize"):
        remote = [int(t) for t in tokenized["tokens"]]
    compare_tokens(backend, tokenizer_dir, local, remote)
    return ServerInfo(model=model, max_model_len=max_model_len)


@contextlib.contextmanager
def _reading(backend: str, what: str) -> Iterator[None]:
    """Reading the server's answer to `what`: one of another shape than vLLM's cannot be read
    (BackendUnreachable, which the gateway refuses to start with and says why), not a fault
    of the gateway's own (which it would end with a traceback)."""
    try:
        yield
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise BackendUnreachable(
            f"backend {backend}: {what}: not a vLLM-compatible server's answer: {exc!r}"
        ) from None


def _length(value: Any) -> int:
    """A context length as the server sent it: a count of tokens (every call is refused under
    one of 0, which the pool's smallest would be)."""
    if type(value) is not int or value < 1:
        raise ValueError(f"max_model_len {value!r} is no context length")
    return value


def compare_tokens(backend: str, tokenizer_dir: Path, local: list[int], remote: list[int]) -> None:
    """BackendMismatch naming the first token where they part, when they do."""
    if local == remote:
        return
    pairs = enumerate(zip(local, remote, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(local), len(remote)))
    raise BackendMismatch(
        f"backend {backend}: the server tokenizes the probe text differently from the tokenizer "
        f"in {tokenizer_dir}: from token {at}, local {local[at : at + 8]} ({len(local)} tokens), "
        f"server {remote[at : at + 8]} ({len(remote)} tokens)"
    )


async def _get_json(
    client: httpx.AsyncClient, backend: str, method: str, path: str, body: Any = None
) -> dict[str, Any]:
    try:
        response = await client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise BackendUnreachable(f"backend {backend}: {method} {path}: {exc!r}") from exc
    if response.status_code != 200:
        raise BackendUnreachable(
            f"backend {backend}: {method} {path} answered {response.status_code}: "
            f"{response.text[:300]}"
        )
    try:
        data: dict[str, Any] = response.json()
    except ValueError:
        raise BackendUnreachable(f"backend {backend}: {method} {path}: not JSON") from None
    return data
