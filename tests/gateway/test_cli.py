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


@pytest.mark.parametrize(
    ("environment", "argv", "said"),
    [
        ({"FAIRGATE_PORT": "-1"}, ["serve"], "port"),
        ({}, ["serve", "--store", "memroy"], "store must be 'memory' or a redis:// URL"),
        ({}, ["serve", "--config", "/nonexistent/fairgate.toml"], "config file not found"),
        ({"FAIRGATE_CONFIG": "/etc/fairgate/fairgate.tmol"}, ["serve"], "FAIRGATE_CONFIG"),
        ({"FAIRGATE_MAX_MESSAGE_BYTES": "-1"}, ["serve"], "max_message_bytes"),
        ({"FAIRGATE_RESERVATION_TTL_S": "inf"}, ["serve"], "reservation_ttl_s"),
        ({"FAIRGATE_DEFAULT_TEMPERATURE": "0.005"}, ["serve"], "default_temperature"),
        ({"FAIRGATE_MAX_CONNECTION_IDLE_S": "2592000"}, ["serve"], "max_connection_idle_s"),
        ({"FAIRGATE_METRICS_PORT": "50051"}, ["serve"], "metrics_port 50051 is the gRPC port"),
    ],
)
def test_serve_refuses_settings_it_cannot_serve_with_and_says_which(
    environment: dict[str, str],
    argv: list[str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each passed (a config path with a typo: the defaults served), or ended in a traceback:
    some only once the engine had loaded (gRPC's C ints), some with a gateway that then
    refused every job (a temperature or a lease the engine and the store refuse)."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    assert said in capsys.readouterr().err
