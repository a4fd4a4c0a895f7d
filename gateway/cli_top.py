"""`fairgate top`: the gateway's tenants, backends and overload level, live in the terminal.

Every `--interval` seconds the view asks the Admin service for `GetStatus` (under the admin key,
never the unauthenticated /metrics) and redraws one frame: the overload level, then a row per
tenant, the most active first (jobs queued and running, calls ready and running, its share of the
KV token-time served in the window against its weight's share, TTFT and queue-wait
percentiles), then a row per backend (running, waiting, KV in use, health). `render` builds a
frame from a status and is pure; the loop around it redraws with plain ANSI sequences on the
terminal's alternate screen, reads keys in cbreak mode and ends on `q`, Ctrl-C or SIGTERM,
restoring the terminal. `--once` prints one frame without escapes and exits (for scripts). A
refused key ends the view (exit 2); a gateway that stops answering is shown in the frame and
asked again at the next interval.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import sys
import termios
import time
import tty
from collections.abc import AsyncIterator, Iterator
from datetime import datetime

import anyio

from fairgate import (
    AdminClient,
    FairgateError,
    GatewayStatus,
    InvalidArgument,
    PermissionDenied,
    TenantStatus,
    Unauthenticated,
)
from fairgate.admin_results import BackendStatus
from fairgate.v1 import admin_pb2 as admin_pb
from gateway.cli_common import add_target, credential, reporting_errors, wire_flag

QUIT_KEYS = frozenset(b"qQ")
ENTER_SCREEN = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
LEAVE_SCREEN = "\x1b[?25h\x1b[?1049l"
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"
BOLD, PLAIN = "\x1b[1m", "\x1b[0m"
TENANT_HEADER = (
    f"{'TENANT':<20} {'WEIGHT':>6} {'JOBS q/run':>10} {'CALLS rdy/run':>13} "
    f"{'SHARE':>6} {'FAIR':>6} {'TTFT p50':>9} {'p99':>7} {'WAIT p99':>9}"
)
BACKEND_HEADER = f"{'BACKEND':<20} {'MODEL':<28} {'RUN':>5} {'WAIT':>5} {'KV':>6}  HEALTH"
FINAL_FAILURES = (Unauthenticated, PermissionDenied, InvalidArgument)  # asking again cannot help


def register_top(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = subparsers.add_parser(
        "top",
        help="live view of tenants, backends and overload (Admin.GetStatus)",
        description="A live view of the gateway: q or Ctrl-C quits.",
    )
    add_target(top)
    top.add_argument("--admin-key", help="the admin key (default: $FAIRGATE_ADMIN_KEY)")
    top.add_argument(
        "--interval", type=_positive, default=2.0, help="seconds between frames (default: 2)"
    )
    top.add_argument(
        "--tenants",
        type=wire_flag(admin_pb.GetStatusRequest.DESCRIPTOR.fields_by_name["max_tenants"], least=0),
        default=20,
        help="the most active tenants listed (default: 20; the server caps it at 200)",
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.set_defaults(func=run_top)


def _positive(text: str) -> float:
    """Finite too: an infinite interval is an infinite RPC timeout, which grpc refuses at once."""
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError("must be a finite number > 0")
    return value


@reporting_errors
async def run_top(args: argparse.Namespace) -> int:
    key = credential(args.admin_key, "FAIRGATE_ADMIN_KEY", "--admin-key")
    async with AdminClient(args.target, key, timeout_s=max(args.interval, 5.0)) as admin:
        if args.once:
            status = await admin.get_status(args.tenants)
            print("\n".join(render(status, args.target, _width())))
            return 0
        return await _live(admin, args)


async def _live(admin: AdminClient, args: argparse.Namespace) -> int:
    """Redraw until a quit key or signal; the terminal is restored before a refusal is told."""
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    with _cbreak(fd), _screen(), anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as sig:
        refused: FairgateError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_until_signal, sig, tg.cancel_scope)
            refused = await _redraw(admin, args, fd)
            tg.cancel_scope.cancel()
    if refused is not None:
        raise refused
    return 0


async def _redraw(
    admin: AdminClient, args: argparse.Namespace, fd: int | None
) -> FairgateError | None:
    """Draw a frame every interval until a quit key (None) or a refusal (returned)."""
    while True:
        try:
            lines = render(await admin.get_status(args.tenants), args.target, _width())
        except FINAL_FAILURES as exc:
            return exc
        except FairgateError as exc:  # the gateway is away: say so and ask again
            lines = [f"fairgate top · {args.target} · {_clock(None)}", f"error: {exc}"]
        _draw(lines)
        if await _quit_pressed(fd, args.interval):
            return None


async def _until_signal(signals: AsyncIterator[signal.Signals], scope: anyio.CancelScope) -> None:
    async for _ in signals:
        scope.cancel()
        return


async def _quit_pressed(fd: int | None, interval: float) -> bool:
    """Wait `interval` seconds for a quit key (any other key redraws at once)."""
    if fd is None:
        await anyio.sleep(interval)
        return False
    with anyio.move_on_after(interval):
        await anyio.wait_readable(fd)
        return bool(QUIT_KEYS & set(os.read(fd, 64)))
    return False


@contextlib.contextmanager
def _cbreak(fd: int | None) -> Iterator[None]:
    """Keys arrive one by one, unechoed; the terminal's mode is restored after."""
    if fd is None:
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _screen() -> Iterator[None]:
    sys.stdout.write(ENTER_SCREEN)
    try:
        yield
    finally:
        sys.stdout.write(LEAVE_SCREEN)
        sys.stdout.flush()


def _draw(lines: list[str]) -> None:
    """Overwrite the screen from its top, the first line bold, cut to the terminal's height."""
    shown = lines[: max(shutil.get_terminal_size().lines - 1, 1)]
    if shown:
        shown[0] = f"{BOLD}{shown[0]}{PLAIN}"
    body = "".join(f"{line}{CLEAR_LINE}\n" for line in shown)
    sys.stdout.write(f"{HOME}{body}{CLEAR_BELOW}")
    sys.stdout.flush()


def _width() -> int | None:
    """The terminal's width; None (no cut) when the output is not a terminal."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def render(status: GatewayStatus, target: str, width: int | None = None) -> list[str]:
    """One frame as lines, cut to `width` when given."""
    overload = f"overload {status.overload_level}"
    if status.overload_reason:
        overload += f" ({status.overload_reason})"
    head = (
        f"fairgate top · {target} · {_clock(status.time)} · window {status.window_s:.0f}s · "
        f"{overload}"
    )
    listed = len(status.tenants)
    lines = [
        head,
        "",
        f"tenants: {status.active_tenants} active, {listed} shown",
        TENANT_HEADER,
        *(_tenant_row(t) for t in status.tenants),
        "",
        f"backends: {len(status.backends)}",
        BACKEND_HEADER,
        *(_backend_row(b) for b in status.backends),
    ]
    return lines if width is None else [line[:width] for line in lines]


def _tenant_row(t: TenantStatus) -> str:
    jobs = f"{t.queued_jobs}/{t.running_jobs}"
    calls = f"{t.ready_calls}/{t.running_calls}"
    return (
        f"{t.tenant_id[:20]:<20} {t.weight:>6g} {jobs:>10} {calls:>13} "
        f"{_percent(t.served_share):>6} {_percent(t.fair_share):>6} "
        f"{_seconds(t.ttft_p50_s):>9} {_seconds(t.ttft_p99_s):>7} "
        f"{_seconds(t.queue_wait_p99_s):>9}"
    )


def _backend_row(b: BackendStatus) -> str:
    kv = _percent(b.kv_usage) if b.kv_usage is not None else "-"
    health = "ok" if b.healthy else "DOWN"
    return f"{b.name[:20]:<20} {b.model[:28]:<28} {b.running:>5} {b.waiting:>5} {kv:>6}  {health}"


def _percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{1000 * value:.0f}ms"
    return f"{value:.2f}s"


def _clock(when: datetime | None) -> str:
    if when is None:
        return time.strftime("%H:%M:%S")
    return when.astimezone().strftime("%H:%M:%S")
