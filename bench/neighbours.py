"""`fairgate bench neighbours`: what one tenant's hostile behaviour costs another tenant.

Each phase starts a gateway in this process (the simulated engine at 10 ms a step and 64 slots,
every call run to its max_tokens; the memory store; justitia) and a light tenant's client in a
process of its own, sending single 4-token `Generate` calls one after another for `--seconds`.
Once the light tenant has warmed up, a fresh tenant with the default quota starts its hostile
behaviour in a third process; once that is under way the light tenant is measured, then the
hostile process is stopped (terminated if it does not stop) and the gateway closed, so nothing a
phase left behind (jobs, streams, a spent share of the loop) reaches the next. The behaviours:
`alone` (none: the baseline), `wide` (jobs of 256 calls x 512 tokens submitted back to back,
refusals retried after their RetryInfo), `getjob` (one 256-call job run to its end, then GetJob
of it from 32 tasks as fast as answered), `streams` (as many WatchJob streams on one running job
as the tenant may open, held open and read), `dense` (invalid jobs of 256 densely linked nodes
as fast as refused) and `packed` (16 MiB SubmitJob requests of millions of empty nodes as fast
as refused). Figures per phase, medians over `--repeats` runs: the light tenant's calls/s and
call time p50 / p99, each also as a ratio to `alone` in the same run, and the hostile tenant's
RPCs answered and refused. A call still running when its phase ends counts as a call of at
least the time it had run when that is longer than every finished call's (the light tenant's
calls may take longer than the phase).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import multiprocessing.connection
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import anyio

from bench.cli_args import add_names
from bench.errors import WorkerFailed
from bench.hostile import HOSTILE_QUOTA, hostile_process
from bench.repeats import medians
from bench.strangers import percentiles_ms, tenant_calls
from gateway.server import running_gateway
from gateway.settings import Settings
from tenants import MemoryQuotaStore, TenantQuota

PHASES = ("alone", "wide", "getjob", "streams", "dense", "packed")
LIGHT_TOKENS = 4  # each of the light tenant's calls
Child = tuple[BaseProcess, Connection]  # a spawned process and the bench's end of its pipe
READY_S = 120.0  # the longest a phase's processes may take to start or to answer
SETTINGS = Settings(
    port=0, simulated_engine=True, simulated_step_s=0.01, max_num_seqs=64, ignore_eos=True
)


@dataclass(frozen=True, slots=True)
class PhaseRun:
    calls_per_s: float  # the light tenant's finished calls a second
    p50_ms: float
    p99_ms: float
    cut_call_ms: float  # how long the light tenant's call cut off at the phase's end had run
    hostile_ok: int  # RPCs answered (wide: jobs admitted; streams: streams opened)
    hostile_refused: int
    calls_per_s_ratio: float = 1.0  # each to `alone` in the same run
    p50_ratio: float = 1.0
    p99_ratio: float = 1.0

    def beside(self, alone: PhaseRun) -> PhaseRun:
        return dataclasses.replace(
            self,
            calls_per_s_ratio=self.calls_per_s / alone.calls_per_s,
            p50_ratio=self.p50_ms / alone.p50_ms,
            p99_ratio=self.p99_ms / alone.p99_ms,
        )


def _light_process(port: int, key: str, seconds: float, conn: Connection) -> None:
    def warmed() -> None:  # then wait for the hostile tenant to be under way
        conn.send("warm")
        conn.recv()

    conn.send(anyio.run(tenant_calls, port, key, seconds, LIGHT_TOKENS, warmed))


@contextlib.contextmanager
def _spawned(target: Callable[..., None], *args: object) -> Iterator[Child]:
    """A process running `target(*args, conn)`, and the bench's end of `conn`; terminated on
    leaving if it has not ended."""
    ours, theirs = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=target, args=(*args, theirs), daemon=True
    )
    process.start()
    theirs.close()
    try:
        yield process, ours
    finally:
        if process.is_alive():
            process.terminate()
        process.join(READY_S)
        if process.is_alive():
            process.kill()
            process.join()
        ours.close()


async def _receive(child: Child, timeout: float) -> Any:
    process, conn = child

    def receive() -> Any:
        if not multiprocessing.connection.wait([conn, process.sentinel], timeout):
            raise WorkerFailed(f"{process.name} sent nothing in {timeout:.0f} s")
        try:
            return conn.recv()
        except EOFError:
            process.join(READY_S)
            raise WorkerFailed(f"{process.name} ended (exit code {process.exitcode})") from None

    return await anyio.to_thread.run_sync(receive)


async def measure_phase(phase: str, seconds: float, settings: Settings = SETTINGS) -> PhaseRun:
    """One phase on a gateway of its own: the light tenant beside `phase`'s hostile one."""
    store = MemoryQuotaStore()
    keys = []
    for tenant, quota in (("light", TenantQuota()), ("hostile", HOSTILE_QUOTA)):
        await store.create_tenant(tenant, tenant, quota)
        keys.append((await store.issue_key(tenant))[1])
    async with (
        running_gateway(settings, store=store) as gateway,
        contextlib.AsyncExitStack() as stack,
    ):
        light = stack.enter_context(_spawned(_light_process, gateway.port, keys[0], seconds))
        hostile = None
        if phase != "alone":
            args = (phase, gateway.port, keys[1])
            hostile = stack.enter_context(_spawned(hostile_process, *args))
        await _receive(light, READY_S)  # warmed up
        if hostile is not None:
            hostile[1].send("begin")
            await _receive(hostile, READY_S)  # under way
        light[1].send("go")
        latencies, cut_s = await _receive(light, seconds + READY_S)
        tally = (0, 0)
        if hostile is not None:
            hostile[1].send("stop")
            tally = await _receive(hostile, READY_S)
    # a call cut off after running longer than every finished one is the slowest: its time so
    # far is a lower bound of its time, and leaving it out would report a starved tenant's
    # one quick call as its p99
    slowest = max(latencies, default=0.0)
    times = [*latencies, cut_s] if cut_s > slowest else latencies
    return PhaseRun(len(latencies) / seconds, *percentiles_ms(times), cut_s * 1e3, *tally)


async def measure(
    phases: Sequence[str], seconds: float, share_slots: bool = False
) -> dict[str, PhaseRun]:
    """One run: `alone` first, then each other phase, with its ratios to `alone`."""
    settings = SETTINGS.model_copy(update={"share_slots": share_slots})
    alone = await measure_phase("alone", seconds, settings)
    run = {"alone": alone}
    for phase in phases:
        if phase != "alone":
            run[phase] = (await measure_phase(phase, seconds, settings)).beside(alone)
    return run


def _table(figures: dict[str, dict[str, float]]) -> str:
    rows = [
        f"{'phase':<8} {'calls/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'calls/s x':>10} "
        f"{'p50 x':>8} {'p99 x':>8} {'hostile ok':>11} {'refused':>8}"
    ]
    for phase, f in figures.items():
        rows.append(
            f"{phase:<8} {f['calls_per_s']:>8.1f} {f['p50_ms']:>9.1f} {f['p99_ms']:>9.1f} "
            f"{f['calls_per_s_ratio']:>10.2f} {f['p50_ratio']:>8.2f} {f['p99_ratio']:>8.2f} "
            f"{f['hostile_ok']:>11.0f} {f['hostile_refused']:>8.0f}"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each phase's measuring")
    parser.add_argument("--repeats", type=int, default=3)
    add_names(parser, "--phases", PHASES, "phase", "alone always runs: the ratios need it")
    parser.add_argument(
        "--share-slots",
        action="store_true",
        help="the gateway keeps each tenant's share of the slots (setting share_slots)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    runs = [
        anyio.run(measure, args.phases, args.seconds, args.share_slots) for _ in range(args.repeats)
    ]
    figures = {phase: medians([run[phase] for run in runs]) for phase in runs[0]}
    print(f"the light tenant's calls beside each phase's hostile tenant (median of {len(runs)}):")
    print(_table(figures))
    if args.json:
        runs_json = [{phase: dataclasses.asdict(r) for phase, r in run.items()} for run in runs]
        result = {"phases": figures, "runs": runs_json, "args": vars(args)}
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
