"""A benchmark repeated: the median of each figure over its runs, and the JSON it writes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Sequence
from typing import Any


def medians(runs: Sequence[Any]) -> dict[str, float]:
    """Each field's median over the runs (dataclass instances of one kind)."""
    names = [f.name for f in dataclasses.fields(runs[0])]
    return {name: statistics.median(getattr(run, name) for run in runs) for name in names}


def write_json(args: argparse.Namespace, figures: dict[str, float], runs: Sequence[Any]) -> None:
    """The figures, every run and the arguments to `args.json`, when it names a file."""
    if args.json:
        result = {**figures, "runs": [dataclasses.asdict(r) for r in runs], "args": vars(args)}
        args.json.write_text(json.dumps(result, indent=2, default=str))
