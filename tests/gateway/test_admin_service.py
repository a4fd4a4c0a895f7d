"""The Admin service through a real grpc.aio server, the auth interceptor and the real client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from fairgate import (
    AdminClient,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from fairgate.v1 import admin_pb2, admin_pb2_grpc
from gateway.admin_service import AdminService
from tenants import MemoryQuotaStore, QuotaUnavailable, TenantQuota
from tenants.models import MAX_KEYS_PER_TENANT
from tests.serving import ADMIN_KEY, serving

pytestmark = pytest.mark.anyio
DEFAULTS = TenantQuota()


class LosesRevokeReply(MemoryQuotaStore):
    """The memory store, whose revocations once `lose` is set are done and then reported
    failed, as when Redis ran the script and its reply was lost (redis-py's one retry too)."""

    lose = False

    async def revoke_key(self, *ids: str) -> bool:
        revoked = await super().revoke_key(*ids)
        if self.lose:
            raise QuotaUnavailable("quota store unavailable")
        return revoked


class Server:
    def __init__(self, store: LosesRevokeReply, target: str) -> None:
        self.store = store
        self.target = target
        self.deleted: list[str] = []  # tenants the service reported deleted
        self.revoked: list[tuple[str, str]] = []  # (tenant, key) it reported revoked

    def admin(self, key: str = ADMIN_KEY) -> AdminClient:
        return AdminClient(self.target, key)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    store = LosesRevokeReply()

    async def on_deleted(tenant_id: str) -> None:
        made.deleted.append(tenant_id)

    async def on_revoked(tenant_id: str, key_id: str) -> None:
        made.revoked.append((tenant_id, key_id))

    service = AdminService(store, on_tenant_deleted=on_deleted, on_key_revoked=on_revoked)
    async with serving(
        store, lambda s: admin_pb2_grpc.add_AdminServicer_to_server(service, s)
    ) as t:
        made = Server(store, t)
        yield made


async def test_tenant_lifecycle(server: Server) -> None:
    async with server.admin() as admin:
        created = await admin.create_tenant(
            "acme", "Acme Corp", tokens_per_minute=6000, max_tokens_ceiling=1024
        )
        assert (created.tenant_id, created.display_name) == ("acme", "Acme Corp")
        assert created.quota.tokens_per_minute == 6000
        assert created.quota.max_tokens_ceiling == 1024
        assert created.quota.default_max_tokens == DEFAULTS.default_max_tokens
        assert created.quota.weight == DEFAULTS.weight
        assert created.keys == ()
        assert created.create_time is not None

        issued = await admin.issue_key("acme", label="ci")
        assert issued.plaintext.startswith(issued.key.prefix)
        assert issued.key.label == "ci"
        assert await server.store.authenticate(issued.plaintext) == "acme"
        fetched = await admin.get_tenant("acme")
        assert [k.key_id for k in fetched.keys] == [issued.key.key_id]
        assert issued.plaintext not in repr(fetched)

        limited = await admin.set_quota("acme", tokens_per_minute=100)
        assert limited.quota.tokens_per_minute == 100
        assert limited.quota.max_tokens_ceiling == 1024  # unset fields keep their values
        weighted = await admin.set_weight("acme", 2.5)
        assert weighted.quota.weight == 2.5
        assert weighted.quota.tokens_per_minute == 100

        await server.store.reserve("acme", "call-1", 80, ttl_s=60.0)
        assert await server.store.settle("acme", "call-1", 30, 20)
        usage = await admin.get_usage("acme")
        assert (usage.input_tokens, usage.output_tokens, usage.settled_calls) == (30, 20, 1)
        assert usage.active_reservations == 0

        await admin.delete_tenant("acme")
        assert server.deleted == ["acme"]
        with pytest.raises(NotFound):
            await admin.get_tenant("acme")
    async with server.admin(issued.plaintext) as former:
        with pytest.raises(Unauthenticated):
            await former.get_tenant("acme")


async def test_update_changes_only_what_is_given(server: Server) -> None:
    async with server.admin() as admin:
        await admin.create_tenant("acme", "Acme", max_queued_jobs=7)
        renamed = await admin.update_tenant("acme", display_name="Acme Corp")
        assert (renamed.display_name, renamed.quota.max_queued_jobs) == ("Acme Corp", 7)
        requoted = await admin.update_tenant("acme", max_queued_jobs=3, daily_token_budget=10**6)
        assert requoted.display_name == "Acme Corp"
        assert (requoted.quota.max_queued_jobs, requoted.quota.daily_token_budget) == (3, 10**6)


async def test_list_pages_cover_every_tenant_once_in_order(server: Server) -> None:
    ids = ["t-e", "t-a", "t-d", "t-c", "t-b"]
    async with server.admin() as admin:
        for tenant_id in ids:
            await admin.create_tenant(tenant_id)
        first = await admin.list_tenants_page(page_size=2)
        assert [t.tenant_id for t in first.tenants] == ["t-a", "t-b"]
        await admin.delete_tenant("t-c")  # between pages: later pages neither skip nor repeat
        await admin.create_tenant("t-0")  # sorts before the cursor: not on later pages
        second = await admin.list_tenants_page(page_size=2, page_token=first.next_page_token)
        assert [t.tenant_id for t in second.tenants] == ["t-d", "t-e"]
        assert second.next_page_token == ""
        listed = [t.tenant_id async for t in admin.list_tenants(page_size=1)]
        assert listed == ["t-0", "t-a", "t-b", "t-d", "t-e"]


async def test_revoked_key_stops_working_and_is_scoped_to_its_tenant(server: Server) -> None:
    async with server.admin() as admin:
        await admin.create_tenant("acme")
        await admin.create_tenant("globex")
        acme_key = await admin.issue_key("acme")
        with pytest.raises(NotFound):
            await admin.revoke_key("globex", acme_key.key.key_id)
        assert await server.store.authenticate(acme_key.plaintext) == "acme"
        assert server.revoked == []  # its jobs and streams left alone too
        await admin.revoke_key("acme", acme_key.key.key_id)
        assert (await admin.get_tenant("acme")).keys == ()
        assert server.revoked == [("acme", acme_key.key.key_id)]
    async with server.admin(acme_key.plaintext) as revoked:
        with pytest.raises(Unauthenticated):
            await revoked.get_usage("acme")


async def test_a_revocation_that_failed_is_finished_by_its_retry(server: Server) -> None:
    """Done in the store, its reply lost: the retry found no key and answered NOT_FOUND without
    the clean-up (the key's jobs ran on, its streams stayed open, the auth cache kept it)."""
    async with server.admin() as admin:
        await admin.create_tenant("acme")
        key_id = (await admin.issue_key("acme")).key.key_id
        server.store.lose = True
        with pytest.raises(Unavailable):
            await admin.revoke_key("acme", key_id)
        server.store.lose = False
        assert server.revoked == []  # owed
        with pytest.raises(NotFound):  # gone already; the clean-up runs now
            await admin.revoke_key("acme", key_id)
        assert server.revoked == [("acme", key_id)]
        assert (await admin.get_tenant("acme")).keys == ()


async def test_not_found_and_already_exists(server: Server) -> None:
    async with server.admin() as admin:
        with pytest.raises(NotFound, match="nobody"):
            await admin.get_tenant("nobody")
        with pytest.raises(NotFound):
            await admin.get_usage("nobody")
        with pytest.raises(NotFound):
            await admin.issue_key("nobody")
        await admin.create_tenant("acme")
        with pytest.raises(AlreadyExists):
            await admin.create_tenant("acme")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda a: a.create_tenant("not ok!"), "tenant_id"),
        (lambda a: a.create_tenant("ok", "x" * 500), "display_name"),
        (lambda a: a.create_tenant("ok", weight=-1.0), "quota"),
        (lambda a: a.set_quota("acme", default_max_tokens=900, max_tokens_ceiling=800), "quota"),
        (lambda a: a.set_quota("acme", max_queued_jobs=-2), "quota"),
        (lambda a: a.set_weight("acme", 0.0), "weight"),
        (lambda a: a.list_tenants_page(page_size=-1), "page_size"),
        (lambda a: a.list_tenants_page(page_token="%%not a token%%"), "page_token"),
        (lambda a: a.list_tenants_page(page_token="bm90IGFuIGlkIQ=="), "page_token"),
        (lambda a: a.get_status(max_tenants=-1), "max_tenants"),
    ],
)
async def test_invalid_argument_names_the_field(
    server: Server, call: Callable[[AdminClient], Awaitable[object]], field: str
) -> None:
    async with server.admin() as admin:
        before = await admin.create_tenant("acme")
        with pytest.raises(InvalidArgument) as caught:
            await call(admin)
        assert [v.field for v in caught.value.field_violations] == [field]
        assert caught.value.field_violations[0].description
        assert await admin.get_tenant("acme") == before
        assert [t.tenant_id async for t in admin.list_tenants()] == ["acme"]


HUGE = "a" * 1_000_000  # shaped like an id, a million characters long
BAD_TENANT_IDS = ["", "not ok!", "-acme", "a" * 65, HUGE, HUGE + "!"]
KEY_ID = "0123456789abcdef"
BAD_KEY_IDS = ["", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", "../key", HUGE]
NAMING_A_TENANT: dict[str, Callable[[AdminClient, str], Awaitable[object]]] = {
    "CreateTenant": lambda a, t: a.create_tenant(t),
    "GetTenant": lambda a, t: a.get_tenant(t),
    "UpdateTenant(name)": lambda a, t: a.update_tenant(t, display_name="x"),
    "UpdateTenant(quota)": lambda a, t: a.update_tenant(t, max_queued_jobs=1),
    "DeleteTenant": lambda a, t: a.delete_tenant(t),
    "IssueKey": lambda a, t: a.issue_key(t),
    "RevokeKey": lambda a, t: a.revoke_key(t, KEY_ID),
    "SetWeight": lambda a, t: a.set_weight(t, 2.0),
    "SetQuota": lambda a, t: a.set_quota(t, max_queued_jobs=1),
    "GetUsage": lambda a, t: a.get_usage(t),
}


@pytest.mark.parametrize("call", NAMING_A_TENANT.values(), ids=NAMING_A_TENANT.keys())
async def test_every_tenant_id_is_checked_before_the_store_and_quoted_short(
    server: Server, call: Callable[[AdminClient, str], Awaitable[object]]
) -> None:
    """Only CreateTenant checked: the others sent any id to the store (whose Redis key names
    each is cached under) and quoted it whole in NOT_FOUND."""
    async with server.admin() as admin:
        for tenant_id in BAD_TENANT_IDS:
            with pytest.raises(InvalidArgument) as caught:
                await call(admin, tenant_id)
            (violation,) = caught.value.field_violations
            assert violation.field == "tenant_id"
            assert len(violation.description) <= 200
            assert len(str(caught.value)) < 1_000
    assert (server.deleted, server.revoked) == ([], [])
    assert await server.store.list_tenants() == []


@pytest.mark.parametrize("key_id", BAD_KEY_IDS)
async def test_a_key_id_no_key_has_is_refused_before_the_store(server: Server, key_id: str) -> None:
    async with server.admin() as admin:
        await admin.create_tenant("acme")
        key = await admin.issue_key("acme")
        with pytest.raises(InvalidArgument) as caught:
            await admin.revoke_key("acme", key_id)
        assert [v.field for v in caught.value.field_violations] == ["key_id"]
        assert len(str(caught.value)) < 1_000
        assert server.revoked == []
        assert await server.store.authenticate(key.plaintext) == "acme"


async def test_tenant_key_is_refused_on_admin(server: Server) -> None:
    async with server.admin() as admin:
        await admin.create_tenant("acme")
        key = await admin.issue_key("acme")
    async with server.admin(key.plaintext) as tenant:
        with pytest.raises(PermissionDenied):
            await tenant.get_tenant("acme")
        with pytest.raises(PermissionDenied):
            await tenant.create_tenant("mine")
        with pytest.raises(PermissionDenied):
            await tenant.get_status()


async def test_unauthenticated_without_a_valid_key(server: Server) -> None:
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetTenant(admin_pb2.GetTenantRequest(tenant_id="acme"))
        assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    for key in ("", "wrong-admin-key", "fg_0123456789abcdef_" + "x" * 43):
        async with server.admin(key) as stranger:
            with pytest.raises(Unauthenticated):
                await stranger.list_tenants_page()


async def test_a_registry_alone_reports_an_empty_status(server: Server) -> None:
    async with server.admin() as admin:
        await admin.create_tenant("acme")
        status = await admin.get_status()
    assert (status.tenants, status.active_tenants, status.backends) == ((), 0, ())
    assert (status.overload_level, status.window_s) == (0, 0.0)
    assert status.time is not None


async def test_a_key_past_the_most_a_tenant_may_hold_is_refused(server: Server) -> None:
    async with server.admin() as admin:
        await admin.create_tenant("acme")
        for _ in range(MAX_KEYS_PER_TENANT):
            await server.store.issue_key("acme")
        with pytest.raises(FailedPrecondition, match="revoke one first"):
            await admin.issue_key("acme")
        assert len((await admin.get_tenant("acme")).keys) == MAX_KEYS_PER_TENANT
