"""`fairgate engine serve` as a user runs it: a subprocess on port 0, read, used, then stopped."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from anyio.abc import ByteReceiveStream
from transformers import LlamaConfig

from gateway.cli import main
from tests.engine.byte_tokenizer import byte_tokenizer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
ANNOUNCE = "fairgate engine serving on "


def model_folder(path: Path) -> Path:
    """A folder the loader accepts: a small tokenizer and a config (the simulated runner needs
    no weights)."""
    tokenizer = byte_tokenizer()
    tokenizer.save_pretrained(path)
    LlamaConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id).save_pretrained(
        path
    )
    return path


async def first_line(stream: ByteReceiveStream) -> str:
    received = b""
    while b"\n" not in received:
        received += await stream.receive()
    return received.split(b"\n", 1)[0].decode()


async def test_engine_serve_prints_its_port_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGATE_")}
    env["FAIRGATE_ENGINE_API_KEY"] = "s3cret"  # the model's routes want it, probes do not
    command = [sys.executable, "-m", "gateway.cli", "engine", "serve", "--simulated"]
    command += ["--port", "0", "--model", str(model_folder(tmp_path)), "--served-model-name", "m"]
    # stderr is inherited: pytest shows it when the test fails
    async with await anyio.open_process(command, cwd=ROOT, env=env, stderr=None) as process:
        assert process.stdout is not None
        with anyio.fail_after(120):  # the subprocess imports torch and transformers
            line = await first_line(process.stdout)
        assert line.startswith(ANNOUNCE), line
        url = f"http://{line.removeprefix(ANNOUNCE)}"
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/health")).status_code == 200
            assert (await http.get("/v1/models")).status_code == 401
            http.headers["Authorization"] = "Bearer s3cret"
            assert (await http.get("/v1/models")).json()["data"][0]["id"] == "m"
            body = {"model": "m", "prompt": "the quick brown fox", "max_tokens": 3}
            completion = (await http.post("/v1/completions", json=body)).json()
            assert completion["usage"]["completion_tokens"] == 3
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--port", "70000"], "70000 is not a port"),  # past it, bind raises no OSError
        (["--port", "0", "--simulated-step-s", "-1"], "simulated_step_s"),
        (["--port", "0", "--config", "missing.toml"], "config file not found"),
        (["--port", "0", "--api-key", "line\nbreak"], "printable ASCII"),
    ],
)
def test_engine_serve_refuses_unusable_settings_with_exit_code_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    said: str,
) -> None:
    for name in [n for n in os.environ if n.startswith("FAIRGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    argv = ["engine", "serve", "--simulated", "--model", str(model_folder(tmp_path)), *flags]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    assert code == 2
    assert said in capsys.readouterr().err


def test_engine_serve_warns_when_it_would_serve_beyond_loopback_with_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Anyone who reaches an unkeyed server runs the model at any priority, ahead of the
    gateway's calls: said before the model loads (here it does not, and nothing is bound)."""
    for name in [n for n in os.environ if n.startswith("FAIRGATE_")]:
        monkeypatch.delenv(name)
    missing = tmp_path / "no-model"
    argv = ["engine", "serve", "--host", "0.0.0.0", "--port", "0", "--model", str(missing)]
    assert main(argv) == 2
    assert "with no API key" in capsys.readouterr().err
    monkeypatch.setenv("FAIRGATE_ENGINE_API_KEY", "s3cret")
    assert main(argv) == 2
    assert "with no API key" not in capsys.readouterr().err
