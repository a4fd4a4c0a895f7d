"""The repo explains itself: no citation points outside it, and every cited section exists.

Product code and docs may name `../shared` only as the default data directory, on the lines
listed in `ALLOWED` (its one home, `bench/paths.py`, and docs/DATA.md, which explains it; a new
line that names it fails, so it is a choice, not an accident); they
never cite `DESIGN.md`, which lives outside the repo. Every `docs/ARCHITECTURE.md §N` they cite,
and every `§N` inside docs/ARCHITECTURE.md itself, names one of its section headings.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
PRODUCT = ("gateway", "tenants", "engine", "predictor", "fairgate", "bench", "protos", "docs")
SKIPPED = ("bench/out/",)  # generated results, not product
OUTSIDE = ("DESIGN.md", "../shared")
# The data directory default, line by line: (file, stripped line), once per occurrence
ALLOWED = Counter(
    [
        (
            "bench/paths.py",
            'DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data"'
            "  # ../shared/data from the repository root",
        ),
        (
            "docs/DATA.md",
            "repository's root (`../shared/data` seen from the root, whatever the working "
            "directory). A file",
        ),
    ]
)
# A citation may break across lines, behind a comment marker (#, //, --) or a docstring's indent
CITATION = re.compile(r"ARCHITECTURE\.md(?:\s|#|//|--)*§(\d+(?:\.\d+)*)")
SECTION_REF = re.compile(r"§(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,6} §(\d+(?:\.\d+)*)\s", re.MULTILINE)


def text_files() -> Iterator[tuple[str, str]]:
    """(path relative to the root, text) of README.md and every text file of the product."""
    yield "README.md", (ROOT / "README.md").read_text(encoding="utf-8")
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*")):
            name = path.relative_to(ROOT).as_posix()
            if not path.is_file() or "__pycache__" in path.parts or name.startswith(SKIPPED):
                continue
            data = path.read_bytes()
            if b"\0" in data:
                continue  # binary (model artifacts)
            try:
                yield name, data.decode("utf-8")
            except UnicodeDecodeError:
                continue


def headings() -> set[str]:
    return set(HEADING.findall(ARCHITECTURE.read_text(encoding="utf-8")))


def test_nothing_points_outside_the_repo_but_the_data_directory() -> None:
    found: Counter[tuple[str, str]] = Counter()
    for name, text in text_files():
        for line in text.splitlines():
            if any(marker in line for marker in OUTSIDE):
                found[(name, line.strip())] += 1
    unexpected = found - ALLOWED
    assert not unexpected, (
        "these lines point outside the repo (cite docs/ARCHITECTURE.md §N instead; a new "
        f"data-directory default goes into ALLOWED): {sorted(unexpected)}"
    )


def test_every_cited_section_exists() -> None:
    sections = headings()
    assert sections, "docs/ARCHITECTURE.md has no `## §N` headings"
    cited, missing = 0, []
    for name, text in text_files():
        refs = SECTION_REF if name == "docs/ARCHITECTURE.md" else CITATION
        for number in refs.findall(text):
            cited += name != "docs/ARCHITECTURE.md"
            if number not in sections:
                missing.append(f"{name}: §{number}")
    assert cited, "no `docs/ARCHITECTURE.md §N` citation found: is CITATION still right?"
    assert not missing, f"cited sections missing from docs/ARCHITECTURE.md: {missing}"


def test_sections_are_numbered_once_and_in_order() -> None:
    numbers = HEADING.findall(ARCHITECTURE.read_text(encoding="utf-8"))
    top = [int(n) for n in numbers if "." not in n]
    assert top == list(range(1, len(top) + 1)), f"top-level sections out of order: {top}"
    assert len(numbers) == len(set(numbers)), "a section number is used twice"
