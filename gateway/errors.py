"""The one place where domain errors become gRPC statuses with rich error details.

Handlers raise the packages' own errors; `to_status` turns each into a status code, a message
and google.rpc details (BadRequest, QuotaFailure, RetryInfo, ErrorInfo), and aborts the RPC.
Anything unexpected is INTERNAL "internal error", logged here, with no internals leaked.

ErrorInfo reasons (domain `fairgate.dev`), one set for every refusal: the quota ones
(`QUOTA_TOKEN_RATE`, `QUOTA_CONCURRENT_CALLS`, `QUOTA_DAILY_BUDGET`, `QUOTA_QUEUED_JOBS`,
`QUOTA_QUEUED_CHARS`, `QUOTA_NODES_PER_JOB`, `QUOTA_STREAMS`, `QUOTA_ADMISSIONS`,
`QUOTA_RPCS`; RESOURCE_EXHAUSTED),
`AUTH_RATE_LIMITED` (too many failed authentications from one peer; RESOURCE_EXHAUSTED),
`LOOP_SHARE_EXCEEDED` (the tenant's requests took more than its share of the event loop to
parse, convert and validate; RESOURCE_EXHAUSTED),
`OVERLOADED` (the gateway holds as much work as it may; UNAVAILABLE), `STORE_UNAVAILABLE` (the
quota store cannot be reached, so new work is refused: fail closed; UNAVAILABLE),
`BACKENDS_UNAVAILABLE` (no backend of a pool the job needs has served for a while; UNAVAILABLE),
`SLO_SHED` (latency targets missed; UNAVAILABLE), `SHUTTING_DOWN` (UNAVAILABLE) and
`JOB_UNREADABLE` (the job's record in the journal cannot be decoded; DATA_LOSS).
Each carries RetryInfo when waiting can help.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, TypeVar, cast

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from engine.errors import EngineClosed, InvalidRequest
from gateway.jobs.errors import FieldViolation, JobInvalid
from tenants.errors import (
    AuthFailed,
    CallClosed,
    KeysFull,
    QuotaExceeded,
    QuotaInvalid,
    QuotaUnavailable,
    RequestInvalid,
    TenantExists,
    TenantInvalid,
    TenantNotFound,
)

log = logging.getLogger(__name__)
DOMAIN = "fairgate.dev"


class FieldsInvalid(ValueError):
    """Request fields (outside a job spec) with values the server cannot accept."""

    def __init__(self, violations: list[FieldViolation]) -> None:
        self.violations = violations
        summary = "; ".join(f"{v.field}: {v.description}" for v in violations)
        super().__init__(f"invalid request: {summary}")


class MalformedRequest(ValueError):
    """Request bytes that are not the method's message."""


class NotFound(Exception):
    """The named object does not exist for this caller (other tenants' jobs included)."""


class PermissionDenied(Exception):
    """The caller is known but may not do this."""


class Unauthenticated(Exception):
    """No valid credentials were presented."""


class Overloaded(Exception):
    """The gateway cannot take more work now; retry after `retry_after_s`. `reason` is the
    ErrorInfo reason: OVERLOADED (it holds all the jobs it may), SLO_SHED (its latency targets
    are missed even with sheddable work held and the batch shrunk), BACKENDS_UNAVAILABLE (a pool
    the job needs has had no backend serving for `pool_down_after_s`)."""

    def __init__(
        self, message: str, retry_after_s: float = 1.0, reason: str = "OVERLOADED"
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


class Throttled(Exception):
    """A caller past a rate; it may try again after `retry_after_s`. `reason` is the ErrorInfo
    reason."""

    reason = ""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class AuthThrottled(Throttled):
    """Too many failed authentications from this peer."""

    reason = "AUTH_RATE_LIMITED"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("too many failed authentications from this address", retry_after_s)


class LoopThrottled(Throttled):
    """The tenant's requests took more than its share of the event loop to parse, convert and
    validate."""

    reason = "LOOP_SHARE_EXCEEDED"

    def __init__(self, retry_after_s: float) -> None:
        message = "this tenant's requests took more than their share of the gateway's time"
        super().__init__(message, retry_after_s)


class JournalUnavailable(Exception):
    """The job journal (Redis) cannot be reached: no job is accepted or dispatched meanwhile."""


class JobUnreadable(Exception):
    """A job's record in the journal cannot be decoded (a field corrupted or gone, a record of
    an incompatible version, a spec this version refuses): unlike an unreachable journal it
    never passes, so nothing waits or retries for it (a replica claiming the job ends it)."""


class ShareUnavailable(Exception):
    """The pool's fair share (Redis) cannot be reached: no call is granted, so none is sent."""


class IdempotencyConflict(Exception):
    """An idempotency key reused with a different job."""


STORE_RETRY_S = 1.0  # retry hint while the quota store is unreachable


def _pack(*messages: object) -> list[any_pb2.Any]:
    packed = []
    for message in messages:
        detail = any_pb2.Any()
        detail.Pack(message)  # type: ignore[arg-type]
        packed.append(detail)
    return packed


def to_status(exc: BaseException) -> status_pb2.Status:
    """The google.rpc.Status for a domain error."""
    if isinstance(exc, JobInvalid | FieldsInvalid):
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=v.field, description=v.description
                )
                for v in exc.violations
            ]
        )
        return _status(code_pb2.INVALID_ARGUMENT, str(exc), bad)
    if isinstance(exc, QuotaExceeded):
        return _quota_status(exc)
    if isinstance(exc, QuotaUnavailable):
        message = "the quota store is unavailable: new work is refused until it returns"
        return _refusal(code_pb2.UNAVAILABLE, "STORE_UNAVAILABLE", message, STORE_RETRY_S)
    if isinstance(exc, JournalUnavailable):
        message = "the job journal is unavailable: new work is refused until it returns"
        return _refusal(code_pb2.UNAVAILABLE, "JOURNAL_UNAVAILABLE", message, STORE_RETRY_S)
    if isinstance(exc, JobUnreadable):
        info = error_details_pb2.ErrorInfo(reason="JOB_UNREADABLE", domain=DOMAIN)
        return _status(code_pb2.DATA_LOSS, str(exc), info)
    if isinstance(exc, Overloaded):
        return _refusal(code_pb2.UNAVAILABLE, exc.reason, str(exc), exc.retry_after_s)
    if isinstance(exc, EngineClosed):
        return _refusal(code_pb2.UNAVAILABLE, "SHUTTING_DOWN", str(exc), STORE_RETRY_S)
    if isinstance(exc, Throttled):
        return _refusal(code_pb2.RESOURCE_EXHAUSTED, exc.reason, str(exc), exc.retry_after_s)
    simple: list[tuple[type[BaseException] | tuple[type[BaseException], ...], int]] = [
        (
            (InvalidRequest, MalformedRequest, QuotaInvalid, RequestInvalid, TenantInvalid),
            code_pb2.INVALID_ARGUMENT,
        ),
        ((NotFound, TenantNotFound), code_pb2.NOT_FOUND),
        ((TenantExists, CallClosed, IdempotencyConflict), code_pb2.ALREADY_EXISTS),
        ((AuthFailed, Unauthenticated), code_pb2.UNAUTHENTICATED),
        (PermissionDenied, code_pb2.PERMISSION_DENIED),
        (KeysFull, code_pb2.FAILED_PRECONDITION),
    ]
    for kinds, code in simple:
        if isinstance(exc, kinds):
            return _status(code, str(exc) or type(exc).__name__)
    log.exception("unexpected error", exc_info=exc)
    return _status(code_pb2.INTERNAL, "internal error")


def _quota_status(exc: QuotaExceeded) -> status_pb2.Status:
    failure = error_details_pb2.QuotaFailure(
        violations=[
            error_details_pb2.QuotaFailure.Violation(
                subject=exc.subject, description=exc.description
            )
        ]
    )
    info = error_details_pb2.ErrorInfo(reason=exc.reason, domain=DOMAIN, metadata=exc.metadata)
    details: list[object] = [failure, info]
    if exc.retry_after_s is not None:
        details.append(_retry_info(exc.retry_after_s))
    return _status(code_pb2.RESOURCE_EXHAUSTED, exc.description, *details)


def _refusal(code: int, reason: str, message: str, retry_after_s: float) -> status_pb2.Status:
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN)
    return _status(code, message, info, _retry_info(retry_after_s))


def _retry_info(retry_after_s: float) -> error_details_pb2.RetryInfo:
    seconds = max(retry_after_s, 0.0)
    nanos = int((seconds - math.floor(seconds)) * 1e9)
    delay = duration_pb2.Duration(seconds=math.floor(seconds), nanos=nanos)
    return error_details_pb2.RetryInfo(retry_delay=delay)


def _status(code: int, message: str, *details: object) -> status_pb2.Status:
    return status_pb2.Status(code=code, message=message, details=_pack(*details))


async def abort_with(
    context: grpc.aio.ServicerContext[object, object], exc: BaseException
) -> NoReturn:
    """Abort the RPC with the status for `exc`."""
    await context.abort_with_status(rpc_status.to_status(to_status(exc)))
    raise AssertionError("abort_with_status returned")  # pragma: no cover


Method = TypeVar("Method", bound=Callable[..., Any])


def grpc_edge(method: Method) -> Method:
    """Translate what a servicer method (unary or server-streaming) raises: domain errors to
    their statuses, anything else to INTERNAL (logged). Cancellation passes through."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def streaming(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for response in method(self, request, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await abort_with(context, exc)

        return cast(Method, streaming)

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_with(context, exc)

    return cast(Method, unary)
