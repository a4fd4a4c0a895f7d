"""Settings as the server commands (`serve`, `demo`, `engine serve`) read them: what is wrong
with them printed as one `error:` line, for an exit code of 2, not a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

from pydantic import ValidationError

from gateway.settings import Settings
from tenants.policies import PolicyError


def settings_or_none(load: Callable[[], Settings]) -> Settings | None:
    """The settings `load` reads, or None once what is wrong with them is printed."""
    try:
        return load()
    except (ValidationError, FileNotFoundError, PolicyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
