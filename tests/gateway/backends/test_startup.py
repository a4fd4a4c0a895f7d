"""The start-up check against a real engine server: the model and the tokenizer must match."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from engine.loader import load_tokenizer
from gateway.backends import BackendMismatch, BackendUnreachable
from gateway.backends.startup import PROBE, check_server, compare_tokens
from tests.engine.byte_tokenizer import byte_tokenizer
from tests.gateway.backends.conftest import MAX_MODEL_LEN, MODEL, Remote, backend_on

pytestmark = pytest.mark.anyio


def other_tokenizer(folder: Path) -> Path:
    """Byte-level BPE of the same family as the served one, with fewer merges."""
    byte_tokenizer(vocab_size=300).save_pretrained(folder)
    return folder


async def test_the_engine_server_passes_and_tells_its_context(
    server: Remote, tokenizer_dir: Path
) -> None:
    async with backend_on(server.url, tokenizer_dir) as backend:
        assert backend.server is not None
        assert (backend.server.model, backend.server.max_model_len) == (MODEL, MAX_MODEL_LEN)


async def test_a_server_of_another_model_is_refused_naming_both(
    server: Remote, tokenizer_dir: Path
) -> None:
    with pytest.raises(BackendMismatch, match=rf"127.0.0.1:\d+: .*\['{MODEL}'\], not 'llama'"):
        async with backend_on(server.url, tokenizer_dir, model="llama"):
            pass


async def test_a_server_with_another_tokenizer_is_refused_saying_where_they_part(
    server: Remote, tmp_path: Path
) -> None:
    folder = other_tokenizer(tmp_path)
    with pytest.raises(BackendMismatch, match=f"tokenizes the probe text differently .*{folder}"):
        async with backend_on(server.url, folder):
            pass


async def test_a_server_without_tokenize_is_unreachable_for_the_check(
    server: Remote, tokenizer_dir: Path
) -> None:
    server.gate.failing["/tokenize"] = 503
    async with httpx.AsyncClient(base_url=server.url) as client:
        with pytest.raises(BackendUnreachable, match="POST /tokenize answered 503"):
            await check_server(client, "b", MODEL, tokenizer_dir, load_tokenizer(tokenizer_dir))


ANSWERS = {  # answers of a shape no vLLM-compatible server gives
    "models not an object": ("/v1/models", b"[]"),
    "a model card without its context": ("/v1/models", b'{"data": [{"id": "%s"}]}'),
    "a context of no tokens": ("/v1/models", b'{"data": [{"id": "%s", "max_model_len": 0}]}'),
    "tokens missing": ("/tokenize", b'{"count": 3}'),
    "a token that is no number": ("/tokenize", b'{"tokens": ["x"]}'),
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
async def test_an_answer_of_another_shape_is_unreachable_for_the_check(
    server: Remote, tokenizer_dir: Path, case: str
) -> None:
    """Read as it came, such an answer raised a KeyError or the like out of the check: the
    gateway ended with a traceback instead of saying which server it could not use (or, for
    a context of 0, started and refused every call)."""
    path, body = ANSWERS[case]

    async def answer() -> AsyncIterator[bytes]:
        yield body.replace(b"%s", MODEL.encode())

    server.gate.bodies[path] = answer
    with pytest.raises(BackendUnreachable, match=f"{path}: not a vLLM-compatible server's"):
        async with backend_on(server.url, tokenizer_dir):
            pass


async def test_a_server_that_is_down_is_unreachable(tokenizer_dir: Path) -> None:
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as client:
        with pytest.raises(BackendUnreachable, match="GET /v1/models"):
            await check_server(client, "b", MODEL, tokenizer_dir, load_tokenizer(tokenizer_dir))


def test_the_mismatch_message_shows_where_the_tokens_part() -> None:
    with pytest.raises(BackendMismatch, match=r"from token 2, local \[3, 4\] .* server \[9\]"):
        compare_tokens("b", Path("/t"), [1, 2, 3, 4], [1, 2, 9])
    with pytest.raises(BackendMismatch, match=r"from token 2, local \[\] \(2 tokens\)"):
        compare_tokens("b", Path("/t"), [1, 2], [1, 2, 3])
    compare_tokens("b", Path("/t"), [1, 2], [1, 2])


def test_the_probe_has_what_tokenizers_differ_on() -> None:
    assert any(ord(c) > 0xFFFF for c in PROBE) and "  " in PROBE and any(c.isdigit() for c in PROBE)
