"""The server's sockets send small writes at once: a response's head and body leave in two
writes, and with Nagle's algorithm the body waited for the client's delayed ACK, 40 ms a call."""

from __future__ import annotations

import socket

from engine.openai_api import listening_socket


def test_accepted_connections_have_nagle_off() -> None:
    with listening_socket("127.0.0.1", 0) as server:
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert client.fileno() == -1
