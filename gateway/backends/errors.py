"""What can go wrong with a backend, named for the state it reports.

`BackendLost`: the backend failed while it held the call (no connection, a dropped stream, a 5xx):
the call may run again elsewhere. `BackendRefused`: the backend answered and refused this call (a
4xx): running it elsewhere would be refused too, so the call fails. `answer_error` reads a server's
error answer by its HTTP status: a 4xx refuses the call, but those that say the server is busy
(408, 429) or is not the one the settings mean to reach (401, 403 and 407: a key it does not take;
404 and 405: no such model or route), which say so of every call sent there; those, any answer
below 400 (a redirect: the settings name the wrong URL) and 502, 503 and 504 (the server, or a
proxy before it, is away) count against the server; any other 5xx (500: the server failed this
call) is a loss the server `answered`: it is up, and the failure may be the call's own, so it says
nothing of the server's health (a tenant's calls that make the server fail must not stop it for
every tenant). `BackendMismatch`: at start-up the server is not the one the
settings describe (another model, another tokenizer). `BackendUnreachable`: at start-up the server
could not be asked at all.
"""

from __future__ import annotations


class BackendError(Exception):
    """Base of every backend error."""


class BackendLost(BackendError):
    """The backend failed while it held the call: the call may run again elsewhere. `answered`:
    the server itself answered that the call failed (it is up)."""

    def __init__(self, message: str, *, answered: bool = False) -> None:
        super().__init__(message)
        self.answered = answered


class BackendRefused(BackendError):
    """The backend refused the call (HTTP 4xx); `status` is the HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class BackendMismatch(BackendError):
    """The server is not what the backend's settings say it serves."""


class BackendUnreachable(BackendError):
    """The start-up check could not reach the server or read its answer."""


BUSY = frozenset({408, 429})  # a 4xx that says the server is busy, not that the call is wrong
# a 4xx that says the server is not the one meant (a key it does not take, no such model or
# route), not that the call is wrong: every call sent there would get it
ELSEWHERE = frozenset({401, 403, 404, 405, 407})
AWAY = frozenset({502, 503, 504})  # the server, or a proxy before it, cannot serve now


def answer_error(message: str, status: int | None) -> BackendError:
    """The error a server's error answer of HTTP `status` (None: it gave none) stands for."""
    if status is None:
        return BackendLost(message, answered=True)
    if 400 <= status < 500 and status not in BUSY | ELSEWHERE:
        return BackendRefused(message, status)
    return BackendLost(message, answered=status >= 500 and status not in AWAY)
