"""Servers of other projects, started once per test session (see each module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.phoenix_server import PhoenixServer, phoenix_command
from tests.integration.vllm_server import VllmServer, vllm_python


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    server = VllmServer(vllm_python())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def phoenix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PhoenixServer]:
    server = PhoenixServer(phoenix_command(), tmp_path_factory.mktemp("phoenix"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
