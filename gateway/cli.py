"""The `fairgate` command: serve, demo, submit, admin, top, engine and bench subcommands."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from gateway.cli_client import register as register_client_commands
from gateway.cli_engine import register as register_engine_commands
from gateway.cli_settings import settings_or_none
from gateway.settings import DTYPES, Settings, load_settings
from tenants.policies import check_servable

BENCHES = {
    "engine": "bench.engine_speed.throughput",
    "sched": "bench.sched",
    "sweep": "bench.sweep",
    "predictor": "bench.prediction.evaluate",
    "gateway": "bench.gateway_overhead",
    "overload": "bench.overload",
    "backends": "bench.backends.cli",
    "replicas": "bench.replicas.cli",
    "backlog": "bench.backlog",
    "journal": "bench.journal",
    "strangers": "bench.strangers",
    "neighbours": "bench.neighbours",
    "wide": "bench.wide_job",
}


def _add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML settings file")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--store", help="'memory' or a redis:// URL")
    parser.add_argument("--policy")
    parser.add_argument("--model", help="'default' (SmolLM2-135M-Instruct) or a local HF folder")
    parser.add_argument("--dtype", choices=DTYPES)
    parser.add_argument("--num-threads", type=int)
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on it")
    parser.add_argument("--replica-id", help="this replica's name (redis store; default host-pid)")


def _server_settings(args: argparse.Namespace) -> Settings:
    """The settings a server runs with; `PolicyError` for a policy it cannot serve."""
    settings = load_settings(args.config, **_overrides(args))
    check_servable(settings.policy)
    return settings


async def _serve(args: argparse.Namespace) -> int:
    from gateway.backends import BackendMismatch, BackendUnreachable
    from gateway.outbox import OutboxInUse
    from gateway.pool import PoolInvalid
    from gateway.server import UnsafeSettings, serve

    settings = settings_or_none(lambda: _server_settings(args))
    if settings is None:
        return 2
    try:
        await serve(settings)
    except (UnsafeSettings, PoolInvalid, BackendMismatch, BackendUnreachable, OutboxInUse) as exc:
        print(f"error: {exc}", file=sys.stderr)  # refused at start, before serving anything
        return 2
    return 0


async def _demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    settings = settings_or_none(lambda: _server_settings(args))
    if settings is None:
        return 2
    return await run_demo(settings, jobs_per_tenant=args.jobs)


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    names = (
        "host",
        "port",
        "store",
        "policy",
        "model",
        "dtype",
        "num_threads",
        "metrics_port",
        "replica_id",
    )
    return {name: getattr(args, name) for name in names}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairgate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    _add_server_flags(serve)
    serve.set_defaults(func=_serve)
    demo = sub.add_parser("demo", help="a server and three tenants' agent jobs, with progress")
    _add_server_flags(demo)
    demo.add_argument("--jobs", type=int, default=3, help="jobs per tenant")
    demo.set_defaults(func=_demo)
    bench = sub.add_parser("bench", help="benchmarks (see docs/BENCHMARKS.md)")
    bench.add_argument("which", choices=sorted(BENCHES))
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    register_client_commands(sub)
    register_engine_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    if args.command == "bench":
        # imported, not run as __main__: a bench's worker processes (spawned) must find its
        # functions by their module's name
        module = importlib.import_module(BENCHES[args.which])
        return int(module.main(args.rest) or 0)
    result: int = anyio.run(args.func, args)
    return result


if __name__ == "__main__":
    sys.exit(main())
