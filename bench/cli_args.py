"""Argument types the benchmarks' command lines share."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection


def names_of(choices: Collection[str], what: str) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of some of `choices` (`what` they are)."""

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        if unknown := [name for name in names if name not in choices]:
            raise argparse.ArgumentTypeError(
                f"no {what} {', '.join(unknown)}; choose from {', '.join(choices)}"
            )
        return names

    return parse


def add_names(
    parser: argparse.ArgumentParser, flag: str, choices: Collection[str], what: str, note: str
) -> None:
    """A flag naming some of `choices`, comma-separated (all of them by default)."""
    parser.add_argument(
        flag,
        type=names_of(choices, what),
        default=list(choices),
        help=f"comma-separated, of {','.join(choices)} ({note})",
    )
