"""`fairgate top`: a frame from a fixed status, `--once`, and the live view in a pseudo-terminal."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import signal
import struct
import sys
import termios
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from fairgate import BackendStatus, GatewayStatus, TenantStatus
from gateway.cli import build_parser
from gateway.cli_top import LEAVE_SCREEN, render
from tests.gateway.busy import two_tenants_running
from tests.gateway.conftest import ADMIN_KEY, Harness

ROOT = Path(__file__).resolve().parents[2]
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# name, weight, jobs queued/running, calls ready/running, served share, fair share
ALPHA_ROW = re.compile(r"alpha\s+2\s+0/1\s+0/2\s+\d+\.\d%\s+66\.7%")
BETA_ROW = re.compile(r"beta\s+1\s+0/1\s+0/2\s+\d+\.\d%\s+33\.3%")


BLANK = TenantStatus("", 1.0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, None, None, None, None)


def tenant(name: str, weight: float, **numbers: Any) -> TenantStatus:
    return dataclasses.replace(BLANK, tenant_id=name, weight=weight, **numbers)


STATUS = GatewayStatus(
    time=datetime(2026, 1, 1, 12, 0, tzinfo=UTC),
    window_s=60.0,
    tenants=(
        tenant(
            "alpha",
            2.0,
            queued_jobs=1,
            running_jobs=2,
            ready_calls=3,
            running_calls=4,
            served_share=0.625,
            fair_share=2 / 3,
            ttft_p50_s=0.042,
            ttft_p99_s=1.5,
            queue_wait_p99_s=0.2,
        ),
        tenant("beta", 0.5, running_jobs=1, running_calls=1, served_share=0.375, fair_share=1 / 3),
    ),
    active_tenants=3,
    backends=(
        BackendStatus("local", "SmolLM2-135M-Instruct", 5, 2, 0.125, True),
        BackendStatus("vllm-1", "SmolLM2-135M-Instruct", 0, 0, None, False),
    ),
    overload_level=2,
    overload_reason="ttft p99 over target",
)


def test_a_frame_shows_tenants_backends_and_the_overload_level() -> None:
    lines = render(STATUS, "gw:50051")
    text = "\n".join(lines)
    assert lines[0].startswith("fairgate top · gw:50051 · ")
    assert "window 60s · overload 2 (ttft p99 over target)" in lines[0]
    assert "tenants: 3 active, 2 shown" in text
    assert re.search(r"alpha\s+2\s+1/2\s+3/4\s+62\.5%\s+66\.7%\s+42ms\s+1\.50s\s+200ms", text)
    assert re.search(r"beta\s+0\.5\s+0/1\s+0/1\s+37\.5%\s+33\.3%\s+-\s+-\s+-", text)
    assert re.search(r"local\s+SmolLM2-135M-Instruct\s+5\s+2\s+12\.5%\s+ok", text)
    assert re.search(r"vllm-1\s+SmolLM2-135M-Instruct\s+0\s+0\s+-\s+DOWN", text)
    assert all(len(line) <= 40 for line in render(STATUS, "gw:50051", width=40))


@pytest.mark.anyio
@pytest.mark.engine_step_s(0.01)
async def test_once_prints_one_frame(harness: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    await two_tenants_running(harness)
    argv = ["top", "--once", "--target", harness.target, "--admin-key", ADMIN_KEY]
    args = build_parser().parse_args(argv)
    assert await args.func(args) == 0
    out = capsys.readouterr().out
    assert ALPHA_ROW.search(out) and BETA_ROW.search(out), out
    assert "\x1b" not in out  # no escapes when the output is not a terminal
    args = build_parser().parse_args([*argv[:-1], "fg_wrong"])
    assert await args.func(args) == 2
    assert "UNAUTHENTICATED" in capsys.readouterr().err


class Terminal:
    """`fairgate top` in a subprocess whose stdin, stdout and stderr are a pseudo-terminal."""

    def __init__(self, process: Process, controller: int) -> None:
        self.process = process
        self.controller = controller
        self.output = ""  # everything written to the terminal so far

    @property
    def screen(self) -> str:
        """The output without its escape sequences."""
        return ESCAPE.sub("", self.output)

    async def read(self) -> bool:
        """Read what the child wrote, once there is some; False once it has closed its end
        (the terminal then reads as EIO, readable for ever: nothing more will come)."""
        await anyio.wait_readable(self.controller)
        try:
            data = os.read(self.controller, 65536)
        except OSError:  # EIO: the child has closed its end
            return False
        self.output += data.decode(errors="replace")
        return bool(data)

    async def shows(self, *patterns: re.Pattern[str]) -> None:
        with anyio.fail_after(30):
            while not all(p.search(self.screen) for p in patterns):
                assert await self.read(), f"the child closed the terminal first:\n{self.screen}"

    async def exit_code(self) -> int:
        """Read the terminal until the child has closed its end; its exit code."""
        with anyio.fail_after(10):
            while await self.read():
                pass
            return await self.process.wait()


@contextlib.asynccontextmanager
async def top_in_terminal(target: str, *flags: str) -> AsyncIterator[Terminal]:
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    command = [sys.executable, "-m", "gateway.cli", "top", "--target", target, *flags]
    env = os.environ | {"FAIRGATE_ADMIN_KEY": ADMIN_KEY}
    try:
        process = await anyio.open_process(
            command, stdin=terminal, stdout=terminal, stderr=terminal, cwd=ROOT, env=env
        )
        os.close(terminal)  # the child's end only: its exit then reads as EOF here
        try:
            yield Terminal(process, controller)
        finally:
            if process.returncode is None:
                process.kill()
            await process.aclose()
    finally:
        os.close(controller)


@pytest.mark.anyio
@pytest.mark.engine_step_s(0.01)
@pytest.mark.parametrize("quit_by", ["q", "ctrl-c"])
async def test_top_in_a_terminal_shows_the_running_tenants_and_quits(
    harness: Harness, quit_by: str
) -> None:
    await two_tenants_running(harness)
    async with top_in_terminal(harness.target, "--interval", "0.2") as terminal:
        await terminal.shows(ALPHA_ROW, BETA_ROW, re.compile("overload 0"), re.compile("local"))
        if quit_by == "q":
            os.write(terminal.controller, b"q")
        else:  # what Ctrl-C sends the terminal's foreground process
            terminal.process.send_signal(signal.SIGINT)
        assert await terminal.exit_code() == 0
    assert terminal.output.endswith(LEAVE_SCREEN)  # the terminal is given back as it was
    assert "error" not in terminal.screen


@pytest.mark.anyio
async def test_top_in_a_terminal_exits_2_when_its_key_is_refused(harness: Harness) -> None:
    async with top_in_terminal(harness.target, "--admin-key", harness.keys["alpha"]) as terminal:
        assert await terminal.exit_code() == 2
    assert "PERMISSION_DENIED" in terminal.screen


@pytest.mark.parametrize("interval", ["inf", "nan", "0", "-1"])
def test_an_interval_that_is_not_a_finite_positive_number_is_the_flags_error(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--interval inf` was taken: every GetStatus then got an infinite timeout, which grpc
    answers DEADLINE_EXCEEDED at once, and the view showed nothing but that error."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["top", "--interval", interval])
    assert exited.value.code == 2
    assert "--interval: must be" in capsys.readouterr().err
