"""What the client-side subcommands share: the target flag, credentials, error reporting, JSON.

Exit codes: a handler's own result, or 2 when the request was refused (the error and its
details go to stderr) or could not be made (a missing key or flag, an unreadable or malformed
file).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from enum import Enum
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from fairgate import FairgateError, JobSpecInvalid

DEFAULT_TARGET = "127.0.0.1:50051"
_WIRE_BITS = {FieldDescriptor.TYPE_INT32: 31, FieldDescriptor.TYPE_INT64: 63}
Handler = Callable[[argparse.Namespace], Awaitable[int]]


class CommandIncomplete(Exception):
    """A value the command needs is missing: a key (flag or variable), a quota flag."""


def add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=os.environ.get("FAIRGATE_TARGET", DEFAULT_TARGET),
        help=f"gateway HOST:PORT (default: $FAIRGATE_TARGET or {DEFAULT_TARGET})",
    )


def credential(value: str | None, variable: str, flag: str) -> str:
    """The key from the flag, else from the environment variable. It travels in a gRPC header,
    which carries printable ASCII alone: grpc meets anything else (a stray newline) with an
    internal error and its traceback, so it is told here."""
    key = value or os.environ.get(variable, "")
    if not key:
        raise CommandIncomplete(f"give {flag} or set {variable}")
    if not (key.isascii() and key.isprintable()):
        raise CommandIncomplete(
            f"{flag} (or {variable}) must be printable ASCII (a stray newline?)"
        )
    return key


def wire_flag(
    field: FieldDescriptor, kind: Callable[[str], Any] = int, least: int | None = None
) -> Callable[[str], Any]:
    """A flag's parser: its `kind`, from `least` where given and within the range of `field`,
    the wire field it goes in (a value past it is the flag's error, not a traceback where the
    request is built)."""
    bits = _WIRE_BITS.get(field.type)

    def parse(text: str) -> Any:
        value = kind(text)
        if bits is not None and not -(1 << bits) <= value < 1 << bits:
            raise argparse.ArgumentTypeError(f"{text} is out of range (at most {(1 << bits) - 1})")
        if least is not None and value < least:
            raise argparse.ArgumentTypeError(f"{text} is out of range (at least {least})")
        return value

    return parse


def reporting_errors(handler: Handler) -> Handler:
    """Print refused requests (with their details) on stderr and return exit code 2."""

    @functools.wraps(handler)
    async def run(args: argparse.Namespace) -> int:
        try:
            return await handler(args)
        except FairgateError as exc:
            print(f"error: {exc}", file=sys.stderr)
            for violation in exc.field_violations:
                print(f"  {violation.field}: {violation.description}", file=sys.stderr)
            for quota in exc.quota_violations:
                print(f"  {quota.subject}: {quota.description}", file=sys.stderr)
            if exc.retry_after_s is not None:
                print(f"  retry after {exc.retry_after_s:.1f} s", file=sys.stderr)
        except (CommandIncomplete, JobSpecInvalid, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
        return 2

    return run


def print_json(result: object) -> None:
    """A result dataclass (or a list of them) as indented JSON on stdout."""
    print(json.dumps(result, indent=2, default=_plain))


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.name.lower()
    raise TypeError(f"cannot show {type(value).__name__} as JSON")
