"""The client side of the `fairgate` command: `submit` (here), `admin ...` (cli_admin), `top`.

`register(subparsers)` adds the subcommands to the main parser; each sets `func` to an async
handler taking the parsed arguments and returning the exit code: 0 when the request (and, for
`submit`, the job) succeeded, 1 when the job ended FAILED or CANCELLED, 2 when the request was
refused or could not be made. `submit` runs the job through RunJob, so interrupting it (Ctrl-C)
cancels the job; `--no-watch` submits it and returns at once.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import aclosing
from pathlib import Path

from fairgate import Client, job_from_json
from fairgate.results import JobEvent, JobFinished, JobState, NodeStateChanged, TokenDelta
from gateway.cli_admin import register_admin
from gateway.cli_common import add_target, credential, reporting_errors
from gateway.cli_top import register_top


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    submit = subparsers.add_parser(
        "submit",
        help="run a job from a JSON file and stream its progress",
        description="Run a job (a JobSpec in protobuf JSON, see docs/JOBS.md).",
    )
    submit.add_argument("job", type=Path, help="job spec file (JSON), '-' for stdin")
    add_target(submit)
    submit.add_argument("--api-key", help="tenant API key (default: $FAIRGATE_API_KEY)")
    submit.add_argument(
        "--no-watch", action="store_true", help="submit, print the job id and return"
    )
    submit.set_defaults(func=submit_job)
    register_admin(subparsers)
    register_top(subparsers)


@reporting_errors
async def submit_job(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if str(args.job) == "-" else args.job.read_text(encoding="utf-8")
    spec = job_from_json(text)
    api_key = credential(args.api_key, "FAIRGATE_API_KEY", "--api-key")
    async with Client(args.target, api_key) as client:
        if args.no_watch:
            job = await client.submit_job(spec)
            print(f"{job.job_id} {job.state.name.lower()}")
            return 0
        progress = Progress()
        async with aclosing(client.run_job(spec)) as events:
            async for event in events:
                progress.show(event)
        return 0 if progress.final_state is JobState.SUCCEEDED else 1


class Progress:
    """Prints node state changes with their token counts, then the job's outputs."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.final_state: JobState | None = None
        self._start: float | None = None

    def show(self, event: JobEvent) -> None:
        elapsed = self._elapsed(event)
        if isinstance(event, TokenDelta):
            self.tokens[event.node_id] = self.tokens.get(event.node_id, 0) + event.token_count
        elif isinstance(event, NodeStateChanged):
            node = event.node
            count = self.tokens.get(node.id, 0)
            line = f"{elapsed:8.2f}s  {node.id:<24} {node.state.name.lower():<10} {count:>6} tok"
            print(f"{line}  {node.reason}".rstrip(), flush=True)
        elif isinstance(event, JobFinished):
            self._finish(event)

    def _elapsed(self, event: JobEvent) -> float:
        """Seconds since the first event, by the server's event times."""
        if event.time is None:
            return 0.0
        seconds = event.time.timestamp()
        if self._start is None:
            self._start = seconds
        return seconds - self._start

    def _finish(self, event: JobFinished) -> None:
        job = event.job
        self.final_state = job.state
        usage = job.usage
        print(
            f"job {job.job_id} {job.state.name.lower()}: {usage.prompt_tokens} prompt + "
            f"{usage.output_tokens} output tokens" + (f" ({job.reason})" if job.reason else "")
        )
        for node in job.nodes:
            print(f"\n--- {node.id} ({node.state.name.lower()}, {node.output_tokens} tokens)")
            print(node.output if node.output else f"({node.reason or 'no output'})")
