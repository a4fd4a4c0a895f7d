"""`fairgate submit` through the real parser and client against the real gateway harness."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fairgate import JobBuilder, job_from_json, job_to_json
from fairgate.v1 import gateway_pb2 as pb
from gateway.cli import build_parser
from tests.gateway.conftest import Harness

pytestmark = pytest.mark.anyio
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def fairgate(*argv: str) -> int:
    args = build_parser().parse_args(list(argv))
    code: int = await args.func(args)
    return code


async def test_submit_streams_progress_then_outputs(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    path = EXAMPLES / "map_reduce.json"
    spec = job_from_json(path.read_text(encoding="utf-8"))
    common = ("--target", harness.target, "--api-key", harness.keys["alpha"])
    code = await fairgate("submit", str(path), *common)
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    for node in spec.nodes:
        done = [line for line in lines if line.split()[1:3] == [node.id, "succeeded"]]
        assert len(done) == 1 and int(done[0].split()[3]) == node.sampling.max_tokens
        assert f"--- {node.id} (succeeded, {node.sampling.max_tokens} tokens)" in out
    total = sum(node.sampling.max_tokens for node in spec.nodes)
    summary = rf"^job job-[0-9a-f]{{16}} succeeded: \d+ prompt \+ {total} output tokens$"
    assert re.search(summary, out, re.M)


async def test_submit_no_watch_reads_the_key_from_the_environment(
    harness: Harness,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "job.json"
    path.write_text(job_to_json(JobBuilder().node("a", prompt="hi").build()), encoding="utf-8")
    monkeypatch.setenv("FAIRGATE_API_KEY", harness.keys["alpha"])
    assert await fairgate("submit", str(path), "--target", harness.target, "--no-watch") == 0
    job_id, state = capsys.readouterr().out.split()
    assert state == "running"  # submitted, not waited for
    request = pb.GetJobRequest(job_id=job_id)
    assert (await harness.stub.GetJob(request, metadata=harness.auth("alpha"))).job_id == job_id


async def test_submit_exit_codes(
    harness: Harness,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing = tmp_path / "failing.json"
    too_long = JobBuilder(inputs={"text": "zq xv " * 4000})  # over the model's context
    failing.write_text(job_to_json(too_long.node("a", prompt="{{inputs.text}}").build()))
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"nodes": [{"id": "a", "promptTemplate": "{{b.output}}"}]}))
    common = ("--target", harness.target, "--api-key", harness.keys["alpha"])
    assert await fairgate("submit", str(failing), *common) == 1
    assert re.search(r"^job job-[0-9a-f]{16} failed", capsys.readouterr().out, re.M)
    assert await fairgate("submit", str(invalid), *common) == 2
    assert "nodes[0].prompt_template: {{b.output}}" in capsys.readouterr().err
    assert await fairgate("submit", str(tmp_path / "absent.json"), *common) == 2
    monkeypatch.delenv("FAIRGATE_API_KEY", raising=False)
    assert await fairgate("submit", str(failing), "--target", harness.target) == 2
    assert "FAIRGATE_API_KEY" in capsys.readouterr().err
