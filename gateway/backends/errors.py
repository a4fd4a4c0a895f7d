"""What can go wrong with a backend, named for the state it reports.

`BackendLost`: the backend failed while it held the call (no connection, a dropped stream, a 5xx):
the call may run again elsewhere. `BackendRefused`: the backend answered and refused this call (a
4xx): running it elsewhere would be refused too, so the call fails. `BackendMismatch`: at start-up
the server is not the one the settings describe (another model, another tokenizer).
`BackendUnreachable`: at start-up the server could not be asked at all.
"""

from __future__ import annotations


class BackendError(Exception):
    """Base of every backend error."""


class BackendLost(BackendError):
    """The backend failed while it held the call: the call may run again elsewhere."""


class BackendRefused(BackendError):
    """The backend refused the call (HTTP 4xx); `status` is the HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class BackendMismatch(BackendError):
    """The server is not what the backend's settings say it serves."""


class BackendUnreachable(BackendError):
    """The start-up check could not reach the server or read its answer."""
