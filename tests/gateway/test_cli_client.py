"""`fairgate submit` through the real parser, client and a real grpc.aio server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fairgate import JobBuilder, job_from_json, job_to_json
from fairgate.v1 import gateway_pb2_grpc
from gateway.cli import build_parser
from tenants import MemoryQuotaStore, TenantQuota
from tests.echo_gateway import EchoGateway
from tests.serving import serving

pytestmark = pytest.mark.anyio
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class Env:
    target: str
    api_key: str


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    store = MemoryQuotaStore()
    await store.create_tenant("acme", "Acme", TenantQuota())
    _, api_key = await store.issue_key("acme")
    service = EchoGateway(store)
    async with serving(
        store, lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(service, server)
    ) as target:
        yield Env(target, api_key)


async def fairgate(*argv: str) -> int:
    args = build_parser().parse_args(list(argv))
    code: int = await args.func(args)
    return code


async def test_submit_streams_progress_then_outputs(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    path = EXAMPLES / "map_reduce.json"
    spec = job_from_json(path.read_text(encoding="utf-8"))
    code = await fairgate("submit", str(path), "--target", env.target, "--api-key", env.api_key)
    out = capsys.readouterr().out
    assert code == 0
    for node in spec.nodes:
        assert f"{node.id} " in out
    lines = out.splitlines()
    reduce_done = [line for line in lines if line.split()[1:3] == ["reduce", "succeeded"]]
    assert len(reduce_done) == 1 and int(reduce_done[0].split()[3]) > 0  # its token count
    assert "job job-1 succeeded" in out
    assert spec.inputs["parks"] in out.split("--- reduce")[1]  # the echo carries the inputs


async def test_submit_no_watch_reads_the_key_from_the_environment(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "job.json"
    path.write_text(job_to_json(JobBuilder().node("a", prompt="hi").build()), encoding="utf-8")
    monkeypatch.setenv("FAIRGATE_API_KEY", env.api_key)
    assert await fairgate("submit", str(path), "--target", env.target, "--no-watch") == 0
    assert capsys.readouterr().out.split() == ["job-1", "succeeded"]


async def test_submit_exit_codes(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = tmp_path / "failing.json"
    failing.write_text(job_to_json(JobBuilder().node("a", prompt="FAIL").build()))
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"nodes": [{"id": "a", "promptTemplate": "{{b.output}}"}]}))
    common = ("--target", env.target, "--api-key", env.api_key)
    assert await fairgate("submit", str(failing), *common) == 1
    assert "job job-1 failed" in capsys.readouterr().out
    assert await fairgate("submit", str(invalid), *common) == 2
    assert "nodes[0].prompt_template: {{b.output}}" in capsys.readouterr().err
    assert await fairgate("submit", str(tmp_path / "absent.json"), *common) == 2
    monkeypatch.delenv("FAIRGATE_API_KEY", raising=False)
    assert await fairgate("submit", str(failing), "--target", env.target) == 2
    assert "FAIRGATE_API_KEY" in capsys.readouterr().err
