"""One gRPC channel with bearer credentials, and the translation of RPC failures to errors.

Every call made through a `Connection` carries `authorization: Bearer <key>` metadata, and any
`grpc.aio.AioRpcError` it raises leaves as a `fairgate.errors.FairgateError` subclass with the
google.rpc details parsed (`rpc_status.from_call` reads them from the trailing metadata). A
server stream is cancelled when its iterator is closed early, so the server sees the client go.
A call in flight when the connection is closed raises `ClientClosed`: grpc.aio ends it with a
bare CancelledError, which reads as the caller's own task cancelled (a task group drops the
task without a trace).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from fairgate.errors import (
    ERRORS_BY_CODE,
    ClientClosed,
    ErrorInfo,
    FairgateError,
    FieldViolation,
    QuotaViolation,
)

Request = TypeVar("Request")
Response = TypeVar("Response")
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the server's default limit (settings.max_message_bytes)


class Connection:
    """An owned channel: use `async with`, or call `aclose()` when done."""

    def __init__(
        self,
        target: str,
        key: str,
        *,
        timeout_s: float | None = 30.0,
        credentials: grpc.ChannelCredentials | None = None,
        keepalive_s: float = 30.0,
        keepalive_timeout_s: float = 10.0,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """`timeout_s` bounds each unary call; streams run until they end or are closed. While
        a call is open the channel pings the server after `keepalive_s` without a byte from it
        and gives the connection up when no answer comes within `keepalive_timeout_s`: a stream
        through a connection that went silent (a gateway's host lost, a network cut, where no
        reset ever comes) then ends with `Unavailable` instead of waiting for ever, and the
        caller resumes it with `watch_job` on another replica. The gateway refuses pings more
        often than every 10 s (`keepalive_s` below that has the server close the connection).
        `options` are further gRPC channel arguments; they win over the defaults set here."""
        channel_options = [
            *options,  # gRPC takes the first of two arguments of one name: the caller's first
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            *keepalive_options(keepalive_s, keepalive_timeout_s),
            # a watched job may send nothing for minutes (a call queued, an agent thinking):
            # pings go on through such a silence, not only two of them
            ("grpc.http2.max_pings_without_data", 0),
        ]
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target, options=channel_options)
        else:
            self._channel = grpc.aio.secure_channel(target, credentials, options=channel_options)
        self._metadata = (("authorization", f"Bearer {key}"),)
        self.timeout_s = timeout_s
        self._closed = False

    @property
    def channel(self) -> grpc.aio.Channel:
        return self._channel

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        await self._channel.close()

    async def unary(
        self, method: grpc.aio.UnaryUnaryMultiCallable[Request, Response], request: Request
    ) -> Response:
        self._check_open()
        try:
            return await method(request, metadata=self._metadata, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc
        except asyncio.CancelledError:
            self._check_open()
            raise

    async def stream(
        self, method: grpc.aio.UnaryStreamMultiCallable[Request, Response], request: Request
    ) -> AsyncGenerator[Response, None]:
        self._check_open()
        call = method(request, metadata=self._metadata)
        try:
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc
        except asyncio.CancelledError:
            self._check_open()
            raise
        finally:
            call.cancel()

    def _check_open(self) -> None:
        """ClientClosed once closed, unless the caller's own task is being cancelled (then its
        CancelledError goes on)."""
        task = asyncio.current_task()
        if self._closed and (task is None or not task.cancelling()):
            raise ClientClosed from None


def keepalive_options(keepalive_s: float, keepalive_timeout_s: float) -> list[tuple[str, int]]:
    """gRPC options for either end of a connection: a ping after `keepalive_s` without a byte
    from the peer, and the connection given up when no answer comes within
    `keepalive_timeout_s`."""
    timeout_ms = round(keepalive_timeout_s * 1000)
    return [
        ("grpc.keepalive_time_ms", round(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        # gRPC core gives a keepalive ping up by its ping timeout (a minute by default), not by
        # the keepalive timeout (grpc/grpc#39239)
        ("grpc.http2.ping_timeout_ms", timeout_ms),
    ]


def error_from_rpc(exc: grpc.aio.AioRpcError) -> FairgateError:
    """The client error for a failed RPC, with the rich details the server attached."""
    code, message = exc.code(), exc.details() or ""
    kind = ERRORS_BY_CODE.get(code, FairgateError)
    status = _rich_status(exc)
    if status is None:
        return kind(code, message)
    fields: list[FieldViolation] = []
    quotas: list[QuotaViolation] = []
    retry_after_s: float | None = None
    info: ErrorInfo | None = None
    for detail in status.details:
        if (bad := _unpack(detail, error_details_pb2.BadRequest)) is not None:
            fields += [FieldViolation(v.field, v.description) for v in bad.field_violations]
        elif (failure := _unpack(detail, error_details_pb2.QuotaFailure)) is not None:
            quotas += [QuotaViolation(v.subject, v.description) for v in failure.violations]
        elif (retry := _unpack(detail, error_details_pb2.RetryInfo)) is not None:
            retry_after_s = retry.retry_delay.ToTimedelta().total_seconds()
        elif (error_info := _unpack(detail, error_details_pb2.ErrorInfo)) is not None:
            info = ErrorInfo(error_info.reason, error_info.domain, dict(error_info.metadata))
    return kind(
        code,
        message,
        field_violations=tuple(fields),
        quota_violations=tuple(quotas),
        retry_after_s=retry_after_s,
        error_info=info,
    )


def _rich_status(exc: grpc.aio.AioRpcError) -> status_pb2.Status | None:
    try:
        status: status_pb2.Status | None = rpc_status.from_call(exc)
    except (ValueError, DecodeError):  # details that contradict the status, or do not parse
        return None  # (a proxy's, a foreign server's): trust the status alone
    return status


Detail = TypeVar(
    "Detail",
    error_details_pb2.BadRequest,
    error_details_pb2.QuotaFailure,
    error_details_pb2.RetryInfo,
    error_details_pb2.ErrorInfo,
)


def _unpack(detail: any_pb2.Any, kind: type[Detail]) -> Detail | None:
    if not detail.Is(kind.DESCRIPTOR):
        return None
    message = kind()
    detail.Unpack(message)
    return message
