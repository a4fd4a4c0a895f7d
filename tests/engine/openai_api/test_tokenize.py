"""POST /tokenize, in vLLM's shape."""

from __future__ import annotations

import threading

import pytest

from tests.engine.byte_tokenizer import byte_tokenizer
from tests.engine.openai_api.conftest import MAX_MODEL_LEN, MODEL, Server

pytestmark = pytest.mark.anyio

TEXT = "the quick brown fox ü 🦊"


async def test_a_text_is_encoded_as_the_served_tokenizer_does(server: Server) -> None:
    response = await server.http.post("/tokenize", json={"model": MODEL, "prompt": TEXT})
    assert response.status_code == 200
    tokens = byte_tokenizer().encode(TEXT)
    assert response.json() == {
        "count": len(tokens),
        "max_model_len": MAX_MODEL_LEN,
        "tokens": tokens,
        "token_strs": None,
    }


async def test_special_tokens_and_token_strings_on_request(server: Server) -> None:
    tokenizer = byte_tokenizer()
    body = {"prompt": TEXT, "add_special_tokens": False, "return_token_strs": True}
    reply = (await server.http.post("/tokenize", json=body)).json()
    assert reply["tokens"] == tokenizer.encode(TEXT, add_special_tokens=False)
    assert reply["token_strs"] == tokenizer.convert_ids_to_tokens(reply["tokens"])


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "other", "prompt": "x"}, 404, "the model `other` does not exist"),
        ({"prompt": ["x"]}, 400, "prompt"),
        ({}, 400, "prompt"),
    ],
)
async def test_refusals(server: Server, body: dict[str, object], status: int, message: str) -> None:
    response = await server.http.post("/tokenize", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


async def test_a_prompt_over_the_size_limit_is_refused() -> None:
    from tests.engine.openai_api.conftest import serving, sim_core

    async with serving(sim_core(), max_prompt_chars=10) as server:
        response = await server.http.post("/tokenize", json={"prompt": "x" * 11})
    assert response.status_code == 400
    assert "at most 10" in response.json()["error"]["message"]


async def test_a_long_text_is_encoded_and_answered_off_the_event_loop(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 262,144-character text is a million byte tokens: their strings and the 9 MB answer,
    made on the event loop, stopped every stream for 0.8 s."""
    tokenizer = server.core.tokenizer
    threads: list[int] = []
    to_strs = tokenizer.convert_ids_to_tokens

    def convert(ids: list[int]) -> list[str]:
        threads.append(threading.get_ident())
        strs: list[str] = to_strs(ids)
        return strs

    monkeypatch.setattr(tokenizer, "convert_ids_to_tokens", convert)
    body = {"prompt": "\N{GRINNING FACE}" * 262_144, "return_token_strs": True}
    reply = (await server.http.post("/tokenize", json=body, timeout=60)).json()
    assert reply["count"] == len(reply["tokens"]) == len(reply["token_strs"]) == 4 * 262_144
    assert threads and threading.get_ident() not in threads
