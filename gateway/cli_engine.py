"""`fairgate engine serve`: one fairgate engine behind vLLM's OpenAI-compatible HTTP API.

The engine core is built from the settings as the gateway builds its own (engine_setup.py): the
real model, or with `--simulated` the runner that streams instant synthetic tokens; flags
override the TOML file and `FAIRGATE_*` variables. It prints "fairgate engine serving on
HOST:PORT" once connections are accepted (with `--port 0`, the port it was given), and serves
until SIGINT or SIGTERM. With an API key (`--api-key`, else `$FAIRGATE_ENGINE_API_KEY`) the routes
that run the model answer only requests bearing it; with none on a host other than loopback it
warns, as anyone who reaches the port may run the model at any priority. Exit codes: 0 after a
signal, 2 when the settings, the model, the key or the address are unusable (a port outside
0-65535 is refused before the model loads).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import anyio

from gateway.cli_settings import settings_or_none
from gateway.settings import DTYPES, load_settings

API_KEY_ENV = "FAIRGATE_ENGINE_API_KEY"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    engine = subparsers.add_parser("engine", help="fairgate's engine on its own")
    commands = engine.add_subparsers(dest="engine_command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve the engine over vLLM's OpenAI-compatible HTTP API",
        description="Serve /v1/completions, /v1/models, /health and /metrics as vLLM does.",
    )
    serve.add_argument("--port", type=_port, required=True, help="0: any free port (printed)")
    serve.add_argument("--host", help="address to listen on (default: the settings' host)")
    serve.add_argument("--config", type=Path, help="TOML settings file")
    serve.add_argument("--model", help="'default' (SmolLM2-135M-Instruct) or a local HF folder")
    serve.add_argument("--dtype", choices=DTYPES)
    serve.add_argument("--num-threads", type=int)
    serve.add_argument("--served-model-name", help="the model id clients send (default: --model)")
    serve.add_argument(
        "--api-key",
        help=f"clients must send `Authorization: Bearer KEY` (default: ${API_KEY_ENV}; "
        "a flag shows in the process list, the variable does not)",
    )
    serve.add_argument(
        "--simulated", action="store_true", help="instant synthetic tokens (gateway benchmarks)"
    )
    serve.add_argument(
        "--simulated-step-s",
        type=float,
        help="with --simulated: each step takes this long on the wall clock (default 0)",
    )
    serve.set_defaults(func=serve_engine)


async def serve_engine(args: argparse.Namespace) -> int:
    from engine.errors import EngineError
    from engine.loader import served_model_name
    from engine.openai_api import serve
    from gateway.engine_setup import build_engine_core
    from gateway.server import is_loopback

    settings = settings_or_none(
        lambda: load_settings(
            args.config,
            host=args.host,
            model=args.model,
            dtype=args.dtype,
            num_threads=args.num_threads,
            simulated_engine=args.simulated or None,
            simulated_step_s=args.simulated_step_s,
        )
    )
    if settings is None:
        return 2
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if api_key is not None and not (api_key.isascii() and api_key.isprintable()):
        print("error: the API key must be printable ASCII (a header carries it)", file=sys.stderr)
        return 2
    if api_key is None and not is_loopback(settings.host):
        print(
            f"warning: serving on {settings.host} with no API key: anyone who reaches the port "
            f"runs the model, at any priority; set {API_KEY_ENV}",
            file=sys.stderr,
        )
    try:
        core = await anyio.to_thread.run_sync(build_engine_core, settings)
        await serve(
            core,
            args.served_model_name or served_model_name(settings.model),
            settings.host,
            args.port,
            on_listening=_announce,
            grace_s=settings.grace_s,
            max_body_bytes=settings.max_message_bytes,
            max_prompt_chars=settings.max_prompt_chars,
            api_key=api_key,
        )
    except (EngineError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _port(text: str) -> int:
    """A TCP port, checked by argparse: socket.bind raises OverflowError, no OSError, past it."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535)")
    return port


def _announce(host: str, port: int) -> None:
    print(f"fairgate engine serving on {host}:{port}", flush=True)
