"""`fairgate admin ...` through the real parser, client and a real grpc.aio server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fairgate.v1 import admin_pb2_grpc
from gateway.admin_service import AdminService
from gateway.cli import build_parser, main
from tenants import MemoryQuotaStore
from tests.serving import ADMIN_KEY, serving

pytestmark = pytest.mark.anyio


@pytest.fixture
async def target() -> AsyncIterator[str]:
    store = MemoryQuotaStore()
    service = AdminService(store)
    async with serving(
        store, lambda server: admin_pb2_grpc.add_AdminServicer_to_server(service, server)
    ) as served:
        yield served


class Cli:
    def __init__(self, target: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.target = target
        self.capsys = capsys

    async def run(self, *argv: str, key: str = ADMIN_KEY) -> tuple[int, str, str]:
        args = build_parser().parse_args(
            ["admin", *argv, "--target", self.target, "--admin-key", key]
        )
        code: int = await args.func(args)
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err

    async def json(self, *argv: str) -> Any:
        code, out, err = await self.run(*argv)
        assert code == 0, err
        return json.loads(out)


async def test_admin_commands_manage_a_tenant(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(target, capsys)
    created = await cli.json("tenant", "create", "acme", "--name", "Acme", "--weight", "2")
    assert created["quota"]["weight"] == 2.0 and created["display_name"] == "Acme"
    issued = await cli.json("key", "issue", "acme", "--label", "ci")
    assert issued["plaintext"].startswith(issued["key"]["prefix"])
    limited = await cli.json("quota", "set", "acme", "--tokens-per-minute", "600")
    assert limited["quota"]["tokens_per_minute"] == 600 and limited["quota"]["weight"] == 2.0
    assert (await cli.json("weight", "set", "acme", "0.5"))["quota"]["weight"] == 0.5
    streams = await cli.json("quota", "set", "acme", "--max-streams", "5")
    assert streams["quota"]["max_streams"] == 5 and streams["quota"]["max_queued_jobs"] == 256
    renamed = await cli.json("tenant", "update", "acme", "--name", "Acme Corp")
    assert renamed["display_name"] == "Acme Corp"
    fetched = await cli.json("tenant", "get", "acme")
    assert [key["key_id"] for key in fetched["keys"]] == [issued["key"]["key_id"]]
    assert (await cli.json("usage", "acme"))["settled_calls"] == 0
    await cli.json("tenant", "create", "globex")
    listed = await cli.json("tenant", "list", "--page-size", "1")
    assert [tenant["tenant_id"] for tenant in listed] == ["acme", "globex"]
    assert (await cli.run("key", "revoke", "acme", issued["key"]["key_id"]))[0] == 0
    assert (await cli.run("tenant", "delete", "acme"))[:2] == (0, "deleted acme\n")
    code, _, err = await cli.run("tenant", "get", "acme")
    assert code == 2 and "NOT_FOUND" in err


async def test_admin_errors_exit_2_with_details(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(target, capsys)
    code, _, err = await cli.run("tenant", "create", "bad id")
    assert code == 2 and "INVALID_ARGUMENT" in err and "  tenant_id:" in err
    await cli.json("tenant", "create", "acme")
    code, _, err = await cli.run("quota", "set", "acme")
    assert code == 2 and "--tokens-per-minute" in err
    issued = await cli.json("key", "issue", "acme")
    code, _, err = await cli.run("usage", "acme", key=issued["plaintext"])
    assert code == 2 and "PERMISSION_DENIED" in err


def test_a_quota_flag_past_its_wire_range_is_the_flags_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It passed the flag's parsing and failed building the request, with a traceback."""
    argv = ["admin", "quota", "set", "acme", "--max-streams", "3000000000"]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--admin-key", "k", "--target", "127.0.0.1:1"])
    assert exited.value.code == 2
    assert "--max-streams: 3000000000 is out of range" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["admin", "tenant", "list", "--page-size", "3000000000"],
        ["admin", "tenant", "list", "--page-size", "-1"],
        ["top", "--once", "--tenants", "3000000000"],
        ["top", "--once", "--tenants", "-1"],
    ],
)
def test_a_count_flag_past_its_wire_range_is_the_flags_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--page-size` and `--tenants` passed any int and failed building the request (an int32),
    with a traceback."""
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--admin-key", "k", "--target", "127.0.0.1:1"])
    assert exited.value.code == 2
    assert f"{argv[-2]}: {argv[-1]} is out of range" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["admin", "tenant", "list"], ["top", "--once"]])
@pytest.mark.parametrize(
    "key",
    [ADMIN_KEY + "\n", ADMIN_KEY + "\r", "clé-" + ADMIN_KEY],
    ids=["newline", "carriage-return", "non-ascii"],
)
async def test_a_key_no_header_can_carry_is_told_not_a_traceback(
    target: str, capsys: pytest.CaptureFixture[str], command: list[str], key: str
) -> None:
    """A stray newline in $FAIRGATE_ADMIN_KEY (or a non-ASCII character) failed deep in grpc's
    metadata with ExecuteBatchError and its traceback."""
    args = build_parser().parse_args([*command, "--target", target, "--admin-key", key])
    assert await args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --admin-key") and "printable ASCII" in err
    assert key not in err  # the key is a secret: not echoed
