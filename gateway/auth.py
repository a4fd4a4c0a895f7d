"""Authentication at the gRPC edge: `authorization: Bearer <key>` -> the calling tenant and key.

The interceptor wraps every fairgate handler so that, when the call runs, the key is checked
(tenant keys against the quota store, the admin key for `fairgate.v1.Admin`) and the caller is
put in context variables for the handler; a bad key aborts with UNAUTHENTICATED, a tenant
key on the Admin service with PERMISSION_DENIED. Health and reflection stay open, for messages
of up to `OPEN_MESSAGE_BYTES` (a service or file name): a larger one is refused unparsed.

The request is parsed only once its key has passed: gRPC hands the handler the raw bytes, so a
caller without a key cannot make the event loop parse a message of up to `max_message_bytes`
(a 16 MiB message of millions of empty repeated fields took over a second, every tenant's
calls waiting meanwhile). Bytes that do not parse are INVALID_ARGUMENT. Parsing a tenant's
request is charged to its share of the loop (`LoopBudget`; the admin key's are not counted).
A tenant's RPCs under way, streams included, are counted from the moment its key passes until
the handler ends: one past `max_rpcs_per_tenant` is refused (RESOURCE_EXHAUSTED, QUOTA_RPCS)
before it is parsed, so that a tenant whose RPCs wait cannot hold every one of gRPC's
`maximum_concurrent_rpcs` slots while every other tenant is refused.

Failed authentications are throttled per peer address: each failure takes a token from the
peer's bucket (`failures_per_minute`, refilled continuously); an empty bucket refuses the peer's
calls with RESOURCE_EXHAUSTED + RetryInfo (reason AUTH_RATE_LIMITED) before the store is asked,
so guessing keys is slow and costs the store nothing. A key that passed within the last hour
is not a guess: it is checked as usual whatever its peer's bucket holds, so a caller guessing
from a shared address (a load balancer, a NAT) does not lock out the tenants behind it (a key
never seen before waits for the bucket there). The store lookups of keys that have not passed
lately run `UNKNOWN_LOOKUPS` at a time: a lookup the store fails gives its token back (it is no
failed authentication), so while the store is slow guesses would otherwise hold as many of its
connections as they like. Known keys are cached for `cache_ttl_s`;
`forget_key` and `forget_tenant` drop them at once when a key is revoked or a tenant deleted. A
lookup that was under way across such a withdrawal (its `Revocations` stamp, taken as the RPC's
authentication began, older than the withdrawal) is refused and cached nowhere: the store may
have answered before the key went, and caching that answer would let the key work on.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import grpc
from cachetools import TTLCache
from google.protobuf.message import DecodeError

from gateway.buckets import Buckets
from gateway.errors import (
    AuthThrottled,
    LoopThrottled,
    MalformedRequest,
    PermissionDenied,
    Unauthenticated,
    abort_with,
)
from gateway.loop_budget import LoopBudget
from gateway.revocations import STAMP, Revocations
from gateway.tenant_counts import TenantCounts
from tenants import (
    AuthFailed,
    QuotaExceeded,
    QuotaStore,
    bearer_token,
    hash_key,
    refusals,
    verify_admin,
)
from tenants.api_keys import key_id_of

CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("fairgate_caller")
CALLER_KEY: contextvars.ContextVar[str] = contextvars.ContextVar("fairgate_caller_key")
ADMIN = "__admin__"
ADMIN_PREFIX = "/fairgate.v1.Admin/"
OPEN_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
FAILURES_PER_MINUTE = 30
OPEN_MESSAGE_BYTES = 64 * 1024  # a health or reflection request names a service or a file
PASSED_KEYS_KEPT_S = 3600.0  # how long a key that passed is exempt from its peer's throttle
# store lookups at once of keys that have not passed lately: while the store is slow, a
# stranger's guesses (which give their tokens back when the store fails, as a store failure is
# no failed authentication) hold no more of the connections the quota scripts need
UNKNOWN_LOOKUPS = 8
if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
else:
    Handler = grpc.RpcMethodHandler


def current_tenant() -> str:
    """The tenant whose key authenticated the RPC being served."""
    return CALLER.get()


def current_key() -> str:
    """The id of the key that authenticated the RPC being served ('' for the admin key)."""
    return CALLER_KEY.get("")


@dataclass(frozen=True, slots=True)
class Caller:
    tenant_id: str  # ADMIN for the admin key
    key_id: str = ""


class FailureThrottle:
    """A token bucket of failed authentications per peer."""

    def __init__(
        self, per_minute: int = FAILURES_PER_MINUTE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._buckets = Buckets(per_minute, per_minute / 60, clock)

    def take(self, peer: str) -> float | None:
        """Take a token for an attempt whose outcome is not known yet (attempts made at once
        must not all pass one check): None when taken, else the seconds until one is there."""
        if self._buckets.level(peer) < 1:
            return self._buckets.wait_s(peer, 1.0)
        self._buckets.add(peer, -1.0)
        return None

    def give_back(self, peer: str) -> None:
        """The attempt passed: its token was not a failure's."""
        self._buckets.add(peer, 1.0)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        store: QuotaStore,
        admin_key: str,
        cache_ttl_s: float = 5.0,
        throttle: FailureThrottle | None = None,
        clock: Callable[[], float] = time.monotonic,
        revocations: Revocations | None = None,
        loop_budget: LoopBudget | None = None,
        max_rpcs_per_tenant: int = 0,
    ) -> None:
        self.store = store
        self.admin_key_hash = hash_key(admin_key)
        self.throttle = throttle or FailureThrottle()
        # what was withdrawn after an RPC's authentication began (`STAMP`, for its handler)
        self.revocations = revocations if revocations is not None else Revocations()
        self.loop_budget = loop_budget or LoopBudget()
        # each tenant's RPCs under way, up to `max_rpcs_per_tenant` (0: no limit): gRPC's
        # `maximum_concurrent_rpcs` counts every tenant's together
        self._rpcs = TenantCounts()
        self.max_rpcs_per_tenant = max_rpcs_per_tenant
        # key digest -> caller: a key revoked elsewhere stops working within cache_ttl_s
        self._known: TTLCache[str, Caller] = TTLCache(65_536, cache_ttl_s, timer=clock)
        # the same digests, of the keys that passed lately: not guesses, so never throttled
        self._passed: TTLCache[str, Caller] = TTLCache(65_536, PASSED_KEYS_KEPT_S, timer=clock)
        # the store lookups of the others, at once
        self._unknown = anyio.CapacityLimiter(UNKNOWN_LOOKUPS)

    def forget_key(self, key_id: str) -> None:
        self.revocations.key_revoked(key_id)
        self._forget(lambda caller: caller.key_id == key_id)

    def forget_tenant(self, tenant_id: str) -> None:
        self.revocations.tenant_deleted(tenant_id)
        self._forget(lambda caller: caller.tenant_id == tenant_id)

    def _forget(self, whose: Callable[[Caller], bool]) -> None:
        for cache in (self._known, self._passed):
            for digest in [d for d, c in cache.items() if whose(c)]:
                cache.pop(digest, None)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        method: str = details.method
        if handler is None:
            return None
        if method.startswith(OPEN_PREFIXES):
            return _bounded(handler)
        metadata = dict(details.invocation_metadata or ())
        credential = str(metadata.get("authorization", ""))
        admin = method.startswith(ADMIN_PREFIX)
        return _wrap(
            handler,
            lambda peer, began: self._caller(credential, admin, peer, began),
            self.revocations.stamp,
            self.loop_budget,
            self._held,
        )

    def _held(self, tenant_id: str) -> contextlib.AbstractContextManager[None]:
        """The RPC counted against its tenant's limit while it runs (the admin key's are not)."""
        if tenant_id == ADMIN:
            return contextlib.nullcontext()
        return self._rpcs.holding(tenant_id, self.max_rpcs_per_tenant, refusals.rpcs)

    async def _caller(
        self, credential: str, admin: bool, peer: str, began: int | None = None
    ) -> Caller:
        """The caller whose credential this is; `began` is the RPC's stamp (taken now if not
        given): a key or tenant withdrawn after it is refused, however the store answered."""
        if began is None:
            began = self.revocations.stamp()
        try:  # the key itself, however its header is spelled, so that one key is one entry
            digest = hash_key(bearer_token(credential))
        except AuthFailed:
            digest = ""
        exempt = digest in self._passed
        if not exempt:
            retry = self.throttle.take(peer)
            if retry is not None:
                raise AuthThrottled(retry)
        try:
            async with contextlib.nullcontext() if exempt else self._unknown:
                caller = await self._check(credential, admin, began)
        except Unauthenticated:
            self._passed.pop(digest, None)
            raise
        except BaseException:
            if not exempt:
                self.throttle.give_back(peer)  # not a failed authentication
            raise
        if not exempt:
            self.throttle.give_back(peer)
        self._passed[digest] = caller
        return caller

    async def _check(self, credential: str, admin: bool, began: int) -> Caller:
        if not credential:
            raise Unauthenticated("missing 'authorization: Bearer <key>' metadata")
        try:
            key = bearer_token(credential)
        except AuthFailed as exc:
            raise Unauthenticated(str(exc)) from None
        if verify_admin(key, self.admin_key_hash):
            return Caller(ADMIN)
        digest = hash_key(key)
        caller = self._known.get(digest)
        if caller is None:
            caller = await self._tenant_of(key)
            if self.revocations.since(began, caller.tenant_id, caller.key_id):
                raise Unauthenticated("the API key was revoked")
            self._known[digest] = caller
        if admin:  # a tenant's key (looked up as any is: asked again, it is not looked up again)
            raise PermissionDenied("the Admin service needs the admin key")
        return caller

    async def _tenant_of(self, key: str) -> Caller:
        try:
            return Caller(await self.store.authenticate(key), key_id_of(key))
        except AuthFailed:
            raise Unauthenticated("invalid API key") from None


def _parser(handler: Handler) -> Callable[[bytes], Any]:
    """How the handler's requests are parsed (without a deserializer, gRPC passes the bytes)."""
    return handler.request_deserializer or (lambda raw: raw)


def _bounded(handler: Handler) -> Handler:
    """The open handler, refusing a message over OPEN_MESSAGE_BYTES before it is parsed."""
    parse = _parser(handler)

    def bounded(raw: bytes) -> Any:
        if len(raw) > OPEN_MESSAGE_BYTES:
            raise ValueError(f"a message of {len(raw)} bytes, over {OPEN_MESSAGE_BYTES}")
        return parse(raw)

    return handler._replace(request_deserializer=bounded)  # type: ignore[attr-defined,no-any-return]


_CallerOf = Callable[[str, int], Awaitable[Caller]]  # (peer, stamp) -> the caller
_HeldOf = Callable[[str], contextlib.AbstractContextManager[None]]  # tenant -> its RPC counted


def _wrap(
    handler: Handler,
    caller: _CallerOf,
    stamp: Callable[[], int],
    budget: LoopBudget,
    held: _HeldOf,
) -> Handler:
    parse = _parser(handler)  # the handlers below get the bytes: they parse once the key passes
    if handler.unary_unary is not None:
        inner: Any = handler.unary_unary

        async def unary(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            tokens = await _authenticate(caller, stamp, context)
            try:
                with contextlib.ExitStack() as stack:
                    await _hold(stack, held, context)
                    return await inner(await _parsed(parse, raw, context, budget), context)
            finally:
                _reset(tokens)

        return grpc.unary_unary_rpc_method_handler(unary, None, handler.response_serializer)
    if handler.unary_stream is not None:
        inner_stream: Any = handler.unary_stream

        async def stream(
            raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            tokens = await _authenticate(caller, stamp, context)
            try:
                with contextlib.ExitStack() as stack:
                    await _hold(stack, held, context)
                    request = await _parsed(parse, raw, context, budget)
                    async for response in inner_stream(request, context):
                        yield response
            finally:
                # A stream the client cancelled may be closed by the garbage collector, in
                # another context: there the caller was never set, so there is nothing to reset
                with contextlib.suppress(ValueError):
                    _reset(tokens)

        return grpc.unary_stream_rpc_method_handler(stream, None, handler.response_serializer)
    # fairgate has no client-streaming RPC: one added would be served with no key checked
    raise TypeError(f"no authentication for a client-streaming RPC: {handler!r}")


async def _hold(
    stack: contextlib.ExitStack, held: _HeldOf, context: grpc.aio.ServicerContext[Any, Any]
) -> None:
    """Count the RPC against its tenant's limit until `stack` closes, or refuse it."""
    try:
        stack.enter_context(held(CALLER.get()))
    except QuotaExceeded as exc:
        await abort_with(context, exc)


_Tokens = tuple[contextvars.Token[str], contextvars.Token[str], contextvars.Token[int]]


async def _authenticate(
    caller: _CallerOf,
    stamp: Callable[[], int],
    context: grpc.aio.ServicerContext[Any, Any],
) -> _Tokens:
    began = stamp()  # before the key is looked up: a revocation meanwhile comes after it
    try:
        found = await caller(_peer_host(context.peer()), began)
    except Exception as exc:  # refusals and the store failing: translated once, at the edge
        await abort_with(context, exc)
    return CALLER.set(found.tenant_id), CALLER_KEY.set(found.key_id), STAMP.set(began)


async def _parsed(
    parse: Callable[[bytes], Any],
    raw: bytes,
    context: grpc.aio.ServicerContext[Any, Any],
    budget: LoopBudget,
) -> Any:
    tenant = CALLER.get()
    try:
        with contextlib.nullcontext() if tenant == ADMIN else budget.spending(tenant):
            return parse(raw)
    except DecodeError as exc:
        await abort_with(context, MalformedRequest(f"the request does not parse: {exc}"))
    except LoopThrottled as exc:
        await abort_with(context, exc)


def _reset(tokens: _Tokens) -> None:
    CALLER.reset(tokens[0])
    CALLER_KEY.reset(tokens[1])
    STAMP.reset(tokens[2])


def _peer_host(peer: str) -> str:
    """The address part of a gRPC peer ("ipv4:1.2.3.4:5678" -> "ipv4:1.2.3.4")."""
    host, _, port = peer.rpartition(":")
    return host if host and port.isdigit() else peer
