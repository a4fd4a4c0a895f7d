"""The codebase stays ruff- and mypy-clean: both run as part of the test command."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [
    p
    for p in ("engine", "gateway", "tenants", "predictor", "bench", "fairgate")
    if (ROOT / p).is_dir()
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_is_clean() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = run("mypy", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr
