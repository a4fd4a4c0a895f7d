"""Authentication at the gRPC edge: `authorization: Bearer <key>` -> the calling tenant.

The interceptor wraps every fairgate handler so that, when the call runs, the key is checked
(tenant keys against the quota store, the admin key for `fairgate.v1.Admin`) and the caller is
put in a context variable for the handler; a bad key aborts with UNAUTHENTICATED, a tenant
key on the Admin service with PERMISSION_DENIED. Health and reflection stay open.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from cachetools import TTLCache

from gateway.errors import PermissionDenied, Unauthenticated, abort_with
from tenants import AuthFailed, QuotaStore, bearer_token, hash_key, verify_admin

CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("fairgate_caller")
ADMIN = "__admin__"
ADMIN_PREFIX = "/fairgate.v1.Admin/"
OPEN_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
else:
    Handler = grpc.RpcMethodHandler


def current_tenant() -> str:
    """The tenant whose key authenticated the RPC being served."""
    return CALLER.get()


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, store: QuotaStore, admin_key: str, cache_ttl_s: float = 5.0) -> None:
        self.store = store
        self.admin_key_hash = hash_key(admin_key)
        # key digest -> tenant: a revoked key stops working within cache_ttl_s
        self._known: TTLCache[str, str] = TTLCache(maxsize=65_536, ttl=cache_ttl_s)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        metadata = dict(details.invocation_metadata or ())
        credential = str(metadata.get("authorization", ""))
        admin = method.startswith(ADMIN_PREFIX)
        return _wrap(handler, lambda: self._caller(credential, admin))

    async def _caller(self, credential: str, admin: bool) -> str:
        if not credential:
            raise Unauthenticated("missing 'authorization: Bearer <key>' metadata")
        try:
            key = bearer_token(credential)
        except AuthFailed as exc:
            raise Unauthenticated(str(exc)) from None
        if verify_admin(key, self.admin_key_hash):
            return ADMIN
        if admin:
            try:
                await self.store.authenticate(key)
            except AuthFailed:
                raise Unauthenticated("invalid API key") from None
            raise PermissionDenied("the Admin service needs the admin key")
        digest = hash_key(key)
        tenant = self._known.get(digest)
        if tenant is None:
            try:
                tenant = await self.store.authenticate(key)
            except AuthFailed:
                raise Unauthenticated("invalid API key") from None
            self._known[digest] = tenant
        return tenant


def _wrap(handler: Handler, caller: Callable[[], Awaitable[str]]) -> Handler:
    if handler.unary_unary is not None:
        inner: Any = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            token = await _authenticate(caller, context)
            try:
                return await inner(request, context)
            finally:
                CALLER.reset(token)

        return grpc.unary_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream is not None:
        inner_stream: Any = handler.unary_stream

        async def stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            token = await _authenticate(caller, context)
            try:
                async for response in inner_stream(request, context):
                    yield response
            finally:
                # A stream the client cancelled may be closed by the garbage collector, in
                # another context: there the caller was never set, so there is nothing to reset
                with contextlib.suppress(ValueError):
                    CALLER.reset(token)

        return grpc.unary_stream_rpc_method_handler(
            stream, handler.request_deserializer, handler.response_serializer
        )
    return handler  # no client-streaming RPCs in fairgate


async def _authenticate(
    caller: Callable[[], Awaitable[str]], context: grpc.aio.ServicerContext[Any, Any]
) -> contextvars.Token[str]:
    try:
        return CALLER.set(await caller())
    except (Unauthenticated, PermissionDenied) as exc:
        await abort_with(context, exc)
    except Exception as exc:  # the store failing: translated once, at the edge
        await abort_with(context, exc)
