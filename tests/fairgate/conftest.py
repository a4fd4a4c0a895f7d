"""The SDK tests run against the real gateway harness of the gateway tests."""

from tests.gateway.conftest import harness, spans

__all__ = ["harness", "spans"]
