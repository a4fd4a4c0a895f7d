"""Where the benchmarks read and write: the repository, its results folder, the data directory.

The data directory holds the public traces and prompt sets the benchmarks and the predictor's
training read (docs/DATA.md lists each with its upstream repository and commit). It is one
setting: `--data DIR` on a benchmark's command line, else the `FAIRGATE_DATA` environment
variable, else `shared/data` beside the repository's root. `data_dir` is the only place that
resolves it, so every benchmark finds the same files from any working directory.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bench.errors import DataMissing

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = REPO_ROOT / "bench" / "out"  # generated results, not committed
DATA_ENV = "FAIRGATE_DATA"
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data"  # ../shared/data from the repository root


def data_dir(explicit: Path | None = None) -> Path:
    """The data directory: `explicit` (a `--data` flag), else `$FAIRGATE_DATA`, else the default."""
    if explicit is not None:
        return explicit
    from_env = os.environ.get(DATA_ENV)
    return Path(from_env) if from_env else DEFAULT_DATA


def add_data_flag(parser: argparse.ArgumentParser) -> None:
    """`--data DIR`, defaulting to `data_dir()` as it stands when the parser is built."""
    parser.add_argument(
        "--data",
        type=Path,
        default=data_dir(),
        help=f"the data directory (docs/DATA.md; default ${DATA_ENV}, else {DEFAULT_DATA})",
    )


def data_missing(what: str) -> DataMissing:
    """The error for absent data, saying how to point the benchmarks at the data directory."""
    return DataMissing(f"{what}: pass --data DIR or set {DATA_ENV} (docs/DATA.md)")


def existing(path: Path) -> Path:
    """`path` if it is a file, else `data_missing`'s error naming it."""
    if not path.is_file():
        raise data_missing(f"{path} not found")
    return path
