"""Backends in the settings: `[[backends]]` tables, checked when read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.backends.settings import BackendSettings
from gateway.settings import load_settings

TOML = """
[[backends]]
kind = "openai"
url = "https://gpu-1:8000"
model = "meta/llama"
api_key = "sk-1"
tokenizer = "/models/llama"
tls_ca_file = "/etc/ca.pem"
priority = true
max_num_seqs = 128

[[backends]]
kind = "openai"
name = "gpu-2"
url = "http://gpu-2:8000"
model = "meta/llama"
tokenizer = "/models/llama"
weight = 2.0
"""


def test_toml_backends_are_read_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAIRGATE_BACKENDS", raising=False)
    config = tmp_path / "fairgate.toml"
    config.write_text(TOML)
    first, second = load_settings(config).backends
    assert (first.display_name, first.priority, first.max_num_seqs) == ("gpu-1:8000", True, 128)
    assert first.api_key is not None and first.api_key.get_secret_value() == "sk-1"
    assert "sk-1" not in repr(first)  # a key stays out of logs
    assert first.tls_ca_file == Path("/etc/ca.pem")
    assert (second.display_name, second.weight, second.priority) == ("gpu-2", 2.0, False)


def test_no_backends_by_default_means_the_local_engine() -> None:
    assert load_settings().backends == []


OPENAI = {"kind": "openai", "url": "http://h:1", "model": "m", "tokenizer": "/t"}


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({**OPENAI, "url": None}, "needs `url`"),
        ({**OPENAI, "model": ""}, "needs `url`, `model`"),
        ({**OPENAI, "tokenizer": None}, "`tokenizer`"),
        ({**OPENAI, "url": "gpu-1:8000"}, "http"),
        ({**OPENAI, "tls_ca_file": "/ca.pem", "tls_verify": False}, "tls_verify"),
        ({**OPENAI, "scrape_interval_s": 0}, "greater than or equal"),
        ({**OPENAI, "colour": "red"}, "Extra inputs"),
        ({"kind": "local", "url": "http://h:1"}, "a local backend takes no"),
    ],
)
def test_incomplete_or_contradictory_backends_are_refused(
    fields: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ValidationError, match=complaint):
        BackendSettings(**fields)
