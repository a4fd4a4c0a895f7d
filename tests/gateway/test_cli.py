"""The `fairgate` command's own checks, before anything starts."""

import importlib

import pytest

from gateway.cli import BENCHES, main


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_server_refuses_the_study_only_oracle_and_says_why(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--policy", "sjf-oracle"]) == 2
    error = capsys.readouterr().err
    assert "sjf-oracle" in error and "true output lengths" in error and "justitia" in error


def test_the_policy_setting_is_checked_from_the_environment_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRGATE_POLICY", "sjf-oracle")
    assert main(["serve"]) == 2
    assert "cannot serve" in capsys.readouterr().err


def test_every_bench_name_maps_to_a_module_with_a_main() -> None:
    for name, module in BENCHES.items():
        assert callable(importlib.import_module(module).main), name
