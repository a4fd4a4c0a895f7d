"""The strangers benchmark runs from the CLI: a tenant is served beside callers without a key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main


@pytest.mark.parametrize("keyed", [[], ["--keyed"]], ids=["no key", "a tenant's key"])
def test_the_strangers_bench_serves_the_tenant_beside_them(
    tmp_path: Path, keyed: list[str]
) -> None:
    out = tmp_path / "strangers.json"
    args = ["bench", "strangers", "--seconds", "1", "--strangers", "2", "--repeats", "1", *keyed]
    assert main([*args, "--message-bytes", str(2**16), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["stranger_requests_per_s"] > 0  # every stranger was refused at least once
    for phase in ("alone", "beside"):
        assert result[f"{phase}_calls_per_s"] > 0
        assert 0 < result[f"{phase}_p50_ms"] <= result[f"{phase}_p99_ms"]
