"""Client errors, named for the state they report, with the server's rich details kept.

Every RPC failure becomes a `FairgateError` (or the subclass for its status code) carrying the
google.rpc details the server sent: BadRequest field violations, QuotaFailure violations,
RetryInfo's delay and ErrorInfo. Absent details are empty tuples or None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str  # a path relative to the request message, e.g. `nodes[3].depends_on[0]`
    description: str


@dataclass(frozen=True, slots=True)
class QuotaViolation:
    subject: str  # e.g. `tenant:acme`
    description: str


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    reason: str  # e.g. `QUOTA_TOKEN_RATE`
    domain: str
    metadata: Mapping[str, str] = field(default_factory=dict)


class FairgateError(Exception):
    """An RPC failed; `code` is its gRPC status code, the other attributes its details."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        field_violations: tuple[FieldViolation, ...] = (),
        quota_violations: tuple[QuotaViolation, ...] = (),
        retry_after_s: float | None = None,
        error_info: ErrorInfo | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.field_violations = field_violations
        self.quota_violations = quota_violations
        self.retry_after_s = retry_after_s
        self.error_info = error_info


class InvalidArgument(FairgateError):
    """The request (often a job spec) was refused; `field_violations` says where and why."""


class NotFound(FairgateError):
    """No such job, tenant or key for this caller (another tenant's job reads the same)."""


class AlreadyExists(FairgateError):
    """The object to create exists already."""


class FailedPrecondition(FairgateError):
    """The request cannot be done in the object's present state (a tenant holding the most
    keys a tenant may: revoke one first)."""


class Unauthenticated(FairgateError):
    """The API key is missing, malformed, unknown or revoked."""


class PermissionDenied(FairgateError):
    """The key is valid but may not do this (a tenant key on the Admin service)."""


class QuotaExceeded(FairgateError):
    """A tenant limit refused the request; retry after `retry_after_s` when it is not None."""


class Unavailable(FairgateError):
    """The server is overloaded, shutting down or unreachable; retrying later may succeed."""


class DeadlineExceeded(FairgateError):
    """No answer came within the call's `timeout_s` (a slow server, or a connection gone
    silent before its keepalive gave it up): whether the call took effect is unknown, so a
    SubmitJob is safe to send again only with an idempotency key."""


class ClientClosed(FairgateError):
    """The client was closed (`aclose()`, or its `async with` left) while this call was in
    flight, or before it was made: the call was cancelled on the server as the client left."""

    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.CANCELLED, "the client was closed")


class JobSpecInvalid(ValueError):
    """A job builder was used in a way that cannot produce a job (checked before any RPC)."""


ERRORS_BY_CODE: Mapping[grpc.StatusCode, type[FairgateError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}
