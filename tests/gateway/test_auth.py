"""The key check: its throttle on an injected clock (who is refused when a peer's bucket is empty),
and the kinds of RPC it wraps."""

from __future__ import annotations

from typing import NamedTuple, cast

import anyio
import anyio.lowlevel
import grpc
import pytest

from gateway.auth import PASSED_KEYS_KEPT_S, UNKNOWN_LOOKUPS, AuthInterceptor, FailureThrottle
from gateway.errors import AuthThrottled, Unauthenticated
from tenants import QuotaUnavailable, TenantQuota
from tests.fake_clock import FakeClock
from tests.serving import CountingStore

pytestmark = pytest.mark.anyio
ADMIN_KEY = "admin-key-for-tests-0123456789abcdef"
PEER = "ipv4:10.0.0.1"  # a load balancer: every caller's address
GUESS = "Bearer fg_0123456789abcdef_" + "a" * 43


async def test_a_key_that_passed_is_checked_again_after_its_cache_whatever_the_bucket() -> None:
    store, clock = CountingStore(), FakeClock(0.0)
    await store.create_tenant("acme", "Acme", TenantQuota())
    key = "Bearer " + (await store.issue_key("acme"))[1]
    throttle = FailureThrottle(per_minute=2, clock=clock)
    auth = AuthInterceptor(store, ADMIN_KEY, cache_ttl_s=5.0, throttle=throttle, clock=clock)
    assert (await auth._caller(key, False, PEER)).tenant_id == "acme"
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            await auth._caller(GUESS, False, PEER)
    with pytest.raises(AuthThrottled):
        await auth._caller(GUESS, False, PEER)
    clock.now = 6.0  # past the cache: the key is asked of the store again, not refused
    asked = store.authentications
    assert (await auth._caller(key, False, PEER)).tenant_id == "acme"
    assert store.authentications == asked + 1
    await store.delete_tenant("acme")  # revoked: it fails, and is a guess from then on
    clock.now = 12.0
    with pytest.raises(Unauthenticated):
        await auth._caller(key, False, PEER)
    with pytest.raises(AuthThrottled):
        await auth._caller(key, False, PEER)


async def test_a_key_is_exempt_only_for_a_while_after_it_passed() -> None:
    store, clock = CountingStore(), FakeClock(0.0)
    await store.create_tenant("acme", "Acme", TenantQuota())
    key = "Bearer " + (await store.issue_key("acme"))[1]
    throttle = FailureThrottle(per_minute=1, clock=clock)
    auth = AuthInterceptor(store, ADMIN_KEY, throttle=throttle, clock=clock)
    await auth._caller(key, False, PEER)
    clock.now = PASSED_KEYS_KEPT_S + 1.0
    with pytest.raises(Unauthenticated):
        await auth._caller(GUESS, False, PEER)
    with pytest.raises(AuthThrottled):
        await auth._caller(key, False, PEER)


async def test_one_key_is_one_exempt_entry_however_its_header_is_spelled() -> None:
    """Spellings of one key must not fill the exempt keys and push the others out."""
    store = CountingStore()
    await store.create_tenant("acme", "Acme", TenantQuota())
    key = (await store.issue_key("acme"))[1]
    auth = AuthInterceptor(store, ADMIN_KEY)
    for spelling in ("Bearer ", "bearer ", "BEARER  ", "bEaReR    "):
        assert (await auth._caller(spelling + key, False, PEER)).tenant_id == "acme"
    assert len(auth._passed) == 1


class Yielding(CountingStore):
    """A store whose lookups take a turn of the loop, as a real one's do."""

    async def authenticate(self, plaintext: str) -> str:
        await anyio.lowlevel.checkpoint()
        return await super().authenticate(plaintext)


async def test_guesses_made_at_once_take_their_tokens_before_the_store_answers() -> None:
    store, clock = Yielding(), FakeClock(0.0)
    auth = AuthInterceptor(store, ADMIN_KEY, throttle=FailureThrottle(2, clock), clock=clock)
    outcomes: list[type[Exception]] = []

    async def guess() -> None:
        try:
            await auth._caller(GUESS, False, PEER)
        except (Unauthenticated, AuthThrottled) as exc:
            outcomes.append(type(exc))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(guess)
    assert store.authentications == 2  # the bucket's two tokens, not ten lookups
    assert sorted(o.__name__ for o in outcomes) == ["AuthThrottled"] * 8 + ["Unauthenticated"] * 2
    clock.now = 60.0  # the bucket refilled, and was never driven below empty
    assert auth.throttle.take(PEER) is None


class Slow(CountingStore):
    """A store that, once `slow`, answers no lookup until `answer` is set, and then fails it
    (its timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.slow, self.answer = False, anyio.Event()

    async def authenticate(self, plaintext: str) -> str:
        if not self.slow:
            return await super().authenticate(plaintext)
        self.authentications += 1
        await self.answer.wait()
        raise QuotaUnavailable("timed out")


async def test_keys_not_seen_lately_are_looked_up_a_few_at_a_time_while_the_store_is_slow() -> None:
    """A lookup the store fails gives its token back (no failed authentication), so while the
    store was slow a stranger's guesses went to it as fast as they came, each holding one of the
    connections the quota scripts need; a key that passed lately goes to it all the same."""
    store, clock = Slow(), FakeClock(0.0)
    await store.create_tenant("acme", "Acme", TenantQuota())
    key = "Bearer " + (await store.issue_key("acme"))[1]
    auth = AuthInterceptor(store, ADMIN_KEY, cache_ttl_s=5.0, clock=clock)
    await auth._caller(key, False, PEER)
    store.slow, store.authentications = True, 0
    clock.now = 6.0  # past the cache: the key is looked up again
    failed: list[str] = []

    async def look_up(credential: str) -> None:
        with pytest.raises(QuotaUnavailable):
            await auth._caller(credential, False, PEER)
        failed.append(credential)

    async with anyio.create_task_group() as tg:
        for i in range(UNKNOWN_LOOKUPS + 4):
            tg.start_soon(look_up, f"Bearer fg_{i:016x}_" + "a" * 43)
        tg.start_soon(look_up, key)
        await anyio.wait_all_tasks_blocked()
        assert store.authentications == UNKNOWN_LOOKUPS + 1
        store.answer.set()
    assert len(failed) == UNKNOWN_LOOKUPS + 5 and key in failed


async def test_a_revoked_key_is_exempt_no_more() -> None:
    """A key revoked on this replica is a guess from then on, before its next check fails."""
    store, clock = CountingStore(), FakeClock(0.0)
    await store.create_tenant("acme", "Acme", TenantQuota())
    key = "Bearer " + (await store.issue_key("acme"))[1]
    auth = AuthInterceptor(store, ADMIN_KEY, throttle=FailureThrottle(1, clock), clock=clock)
    caller = await auth._caller(key, False, PEER)
    with pytest.raises(Unauthenticated):
        await auth._caller(GUESS, False, PEER)  # the address's bucket is empty
    assert (await auth._caller(key, False, PEER)) == caller  # exempt
    auth.forget_key(caller.key_id)
    asked = store.authentications
    with pytest.raises(AuthThrottled):
        await auth._caller(key, False, PEER)
    assert store.authentications == asked


class Held(CountingStore):
    """A store whose lookups answer only when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.looked_up, self.answer = anyio.Event(), anyio.Event()

    async def authenticate(self, plaintext: str) -> str:
        tenant = await super().authenticate(plaintext)
        self.looked_up.set()
        await self.answer.wait()
        return tenant


@pytest.mark.parametrize("withdrawn", ["key", "tenant"])
async def test_a_lookup_under_way_across_a_withdrawal_is_refused_and_cached_nowhere(
    withdrawn: str,
) -> None:
    """The store found the key before it was withdrawn and answered after: cached then, the key
    worked on for the cache's life (for a tenant made again under the id: as the new one)."""
    store = Held()
    await store.create_tenant("acme", "Acme", TenantQuota())
    key_id, plaintext = await store.issue_key("acme")
    auth = AuthInterceptor(store, ADMIN_KEY)

    async def look_up() -> None:
        with pytest.raises(Unauthenticated):
            await auth._caller("Bearer " + plaintext, False, PEER)

    async with anyio.create_task_group() as tg:
        tg.start_soon(look_up)
        with anyio.fail_after(5):
            await store.looked_up.wait()
        if withdrawn == "key":
            auth.forget_key(key_id)
        else:
            auth.forget_tenant("acme")
        store.answer.set()
    assert (len(auth._known), len(auth._passed)) == (0, 0)


async def test_a_client_streaming_rpc_is_refused_not_served_with_no_key_checked() -> None:
    """The interceptor wraps unary requests; any other handler was returned as it came, served
    to whoever called it. fairgate has none, so one added fails at once, closed."""
    auth = AuthInterceptor(CountingStore(), ADMIN_KEY)

    async def upload(requests: object, context: object) -> bytes:
        return b""

    handler = grpc.stream_unary_rpc_method_handler(upload)

    async def continuation(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return handler

    details = Details("/fairgate.v1.Gateway/Upload", ())  # as grpc passes them
    with pytest.raises(TypeError, match="client-streaming"):
        await auth.intercept_service(continuation, cast(grpc.HandlerCallDetails, details))


class Details(NamedTuple):
    method: str
    invocation_metadata: tuple[tuple[str, str], ...]
