"""`fairgate serve` replica processes on one Redis, for the replicas benchmark and its tests.

`GatewayReplica` is one gateway process (`python -m gateway.cli serve`, redis store) on a port
chosen once, so that it can be killed and started again where its clients look for it, with its
own outbox file (what it could not settle waits there for its next start). Settings come as
`FAIRGATE_*` variables and a TOML file for the `[[backends]]` tables; start-up waits for the
line that says it serves. Stop is SIGTERM (it hands its jobs over), `kill` is SIGKILL.
`running` starts several at once and stops them all when done.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import anyio

from bench.backends.process import ServerProcess, free_port
from bench.paths import REPO_ROOT
from gateway.backends.settings import BackendSettings

START_TIMEOUT_S = 120.0
# how `fairgate serve`'s logging marks such lines (its stdout and stderr share one pipe, so a
# line may begin with the end of another's)
LOUD = ("WARNING:", "ERROR:", "CRITICAL:")


def backends_toml(backends: Sequence[BackendSettings]) -> str:
    """`[[backends]]` tables for the settings file."""
    lines = []
    for backend in backends:
        lines.append("[[backends]]")
        for name, value in backend.model_dump(exclude_defaults=True, mode="json").items():
            lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class GatewayReplica:
    def __init__(
        self,
        name: str,
        redis_url: str,
        directory: Path,
        backends: Sequence[BackendSettings],
        settings: Mapping[str, str],
    ) -> None:
        self.name = name
        self.port = free_port()
        config = directory / f"gateway-{name}.toml"
        config.write_text(backends_toml(backends), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGATE_")}
        env |= {
            "FAIRGATE_CONFIG": str(config),
            "FAIRGATE_STORE": redis_url,
            "FAIRGATE_REPLICA_ID": name,
            "FAIRGATE_OUTBOX_FILE": str(directory / f"outbox-{name}.jsonl"),
            **{f"FAIRGATE_{k.upper()}": v for k, v in settings.items()},
        }
        command = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(self.port)]
        self._process = ServerProcess(
            command, env, lambda line: line.startswith("fairgate serving on"), REPO_ROOT
        )

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self._process.pid

    def start(self) -> None:
        self._process.start(START_TIMEOUT_S)

    def warnings(self) -> list[str]:
        """What it logged at WARNING or above, over every start, as far as its kept output
        goes (bench/backends/process.py)."""
        return [line for line in self._process.output if any(level in line for level in LOUD)]

    def kill(self) -> None:
        self._process.kill()

    def stop(self) -> None:
        self._process.stop()


@contextlib.asynccontextmanager
async def running(gateways: Sequence[GatewayReplica]) -> AsyncIterator[Sequence[GatewayReplica]]:
    """The gateways started at once (each start waits until its process serves), and stopped
    when the block ends, however it ends."""
    try:
        async with anyio.create_task_group() as tg:
            for gateway in gateways:
                tg.start_soon(anyio.to_thread.run_sync, gateway.start)
        yield gateways
    finally:
        for gateway in gateways:
            gateway.stop()
