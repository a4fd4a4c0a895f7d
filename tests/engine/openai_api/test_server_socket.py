"""The server's sockets send small writes at once: a response's head and body leave in two
writes, and with Nagle's algorithm the body waited for the client's delayed ACK, 40 ms a call."""

from __future__ import annotations

import socket
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest

from engine.openai_api import build_app, listening_socket
from tests.engine.openai_api.conftest import MODEL, Server


def test_accepted_connections_have_nagle_off() -> None:
    with listening_socket("127.0.0.1", 0) as server:
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert client.fileno() == -1


@pytest.mark.anyio
async def test_a_client_gone_before_its_body_is_read_is_no_server_error(server: Server) -> None:
    app = build_app(server.engine, MODEL)
    arrives: Iterator[dict[str, Any]] = iter(
        [
            {"type": "http.request", "body": b'{"model": ', "more_body": True},
            {"type": "http.disconnect"},  # the rest of the body never comes
        ]
    )
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return next(arrives)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(b"content-length", b"1000")],
        "query_string": b"",
    }
    await app(scope, receive, send)  # raises (a 500 and a logged error) if it is not handled
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 400
