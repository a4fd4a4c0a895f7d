"""The `fairgate.v1.Admin` servicer: thin handlers over a QuotaStore that translate and delegate.

Every handler first checks that the caller is the admin (the auth interceptor already refuses
tenant keys; the check keeps the service safe if it is ever served without it). ListTenants
pages by key: the page token is the last tenant id of the previous page (base64url), so a page
never repeats or skips a tenant that existed throughout the listing, whatever is created or
deleted between pages. Every tenant id and key id a request names is checked before the store
sees it (it names Redis keys and is quoted back): a bad one is INVALID_ARGUMENT, quoted no
further than its start. Quota updates read the tenant's quota, apply the set fields and write
the result; concurrent updates of one tenant's quota are last-writer-wins. RevokeKey and
DeleteTenant of what is gone already answer NOT_FOUND after running their clean-up again: the
call that removed it may have failed before its clean-up, or lost its reply. GetStatus reports
what the gateway's `status` source answers (`gateway.status.snapshot` over its dispatcher); a
service without one (the tenant registry alone) runs nothing and reports an empty status.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from fairgate.v1 import admin_pb2 as pb
from fairgate.v1 import admin_pb2_grpc
from gateway.admin_protos import (
    field,
    key_to_proto,
    quota_from_proto,
    status_to_proto,
    tenant_to_proto,
    usage_to_proto,
)
from gateway.auth import ADMIN, CALLER
from gateway.errors import FieldsInvalid, NotFound, PermissionDenied, grpc_edge
from gateway.jobs.errors import FieldViolation
from gateway.status import Status, clamp_limit
from tenants import (
    ApiKey,
    KeyOfAnotherTenant,
    QuotaStore,
    RequestInvalid,
    Tenant,
    TenantInvalid,
    TenantNotFound,
    TenantQuota,
)
from tenants.api_keys import check_key_id
from tenants.models import check_display_name, check_tenant_id

Context = grpc.aio.ServicerContext[Any, Any]
TenantDeleted = Callable[[str], Awaitable[None]]
KeyRevoked = Callable[[str, str], Awaitable[None]]
StatusSource = Callable[[int], Status]  # the status now, at most that many tenants listed
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


async def _nothing(*ids: str) -> None:
    return None


def _idle(limit: int) -> Status:
    return Status(time.time(), 0.0, (), 0, ())


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(
        self,
        store: QuotaStore,
        default_quota: TenantQuota | None = None,
        on_tenant_deleted: TenantDeleted = _nothing,
        on_key_revoked: KeyRevoked = _nothing,
        status: StatusSource = _idle,
    ) -> None:
        """`on_tenant_deleted(tenant_id)` runs after a delete and `on_key_revoked(tenant_id,
        key_id)` after a revocation, e.g. to cancel their jobs and close their streams;
        `status(limit)` answers GetStatus."""
        self.store = store
        self.default_quota = default_quota or TenantQuota()
        self.on_tenant_deleted = on_tenant_deleted
        self.on_key_revoked = on_key_revoked
        self.status = status

    @grpc_edge
    async def CreateTenant(self, request: pb.CreateTenantRequest, context: Context) -> pb.Tenant:
        _require_admin()
        tenant_id = _valid_tenant_id(request.tenant_id)
        with field("display_name"):
            check_display_name(request.display_name)
        quota = quota_from_proto(request.quota, self.default_quota)
        tenant = await self.store.create_tenant(tenant_id, request.display_name, quota)
        return tenant_to_proto(tenant, [])

    @grpc_edge
    async def GetTenant(self, request: pb.GetTenantRequest, context: Context) -> pb.Tenant:
        _require_admin()
        return await self._view(await self.store.get_tenant(_valid_tenant_id(request.tenant_id)))

    @grpc_edge
    async def ListTenants(
        self, request: pb.ListTenantsRequest, context: Context
    ) -> pb.ListTenantsResponse:
        _require_admin()
        size = _page_size(request.page_size)
        after = _decode_token(request.page_token)
        rest = await self.store.list_tenants(after, size + 1)  # one more: is there a next page
        page = []
        for tenant in rest[:size]:
            try:
                page.append(await self._view(tenant))
            except TenantNotFound:  # deleted while we listed
                continue
        next_token = _encode_token(rest[size - 1].tenant_id) if len(rest) > size else ""
        return pb.ListTenantsResponse(tenants=page, next_page_token=next_token)

    @grpc_edge
    async def UpdateTenant(self, request: pb.UpdateTenantRequest, context: Context) -> pb.Tenant:
        _require_admin()
        tenant_id = _valid_tenant_id(request.tenant_id)
        display_name = request.display_name if request.HasField("display_name") else None
        if display_name is not None:
            with field("display_name"):
                check_display_name(display_name)
        quota = None
        if request.HasField("quota"):
            current = await self.store.get_tenant(tenant_id)
            quota = quota_from_proto(request.quota, current.quota)
        tenant = await self.store.update_tenant(tenant_id, display_name=display_name, quota=quota)
        return await self._view(tenant)

    @grpc_edge
    async def DeleteTenant(
        self, request: pb.DeleteTenantRequest, context: Context
    ) -> pb.DeleteTenantResponse:
        _require_admin()
        tenant_id = _valid_tenant_id(request.tenant_id)
        try:
            await self.store.delete_tenant(tenant_id)
        except TenantNotFound:
            # perhaps deleted by a call whose clean-up failed (the journal away): it runs again
            await self.on_tenant_deleted(tenant_id)
            raise
        await self.on_tenant_deleted(tenant_id)
        return pb.DeleteTenantResponse()

    @grpc_edge
    async def IssueKey(self, request: pb.IssueKeyRequest, context: Context) -> pb.IssueKeyResponse:
        _require_admin()
        tenant_id = _valid_tenant_id(request.tenant_id)
        key_id, plaintext = await self.store.issue_key(tenant_id)
        key = _find_key(await self.store.list_keys(tenant_id), key_id, tenant_id)
        # The store keeps no labels yet: the label is echoed here and not listed later.
        return pb.IssueKeyResponse(key=key_to_proto(key, request.label), plaintext=plaintext)

    @grpc_edge
    async def RevokeKey(
        self, request: pb.RevokeKeyRequest, context: Context
    ) -> pb.RevokeKeyResponse:
        _require_admin()
        tenant_id, key_id = _valid_tenant_id(request.tenant_id), _valid_key_id(request.key_id)
        try:
            revoked = await self.store.revoke_key(tenant_id, key_id)
        except KeyOfAnotherTenant:  # left alone, its jobs and streams too
            raise _key_not_found(key_id, tenant_id) from None
        # gone already: perhaps revoked by a call whose clean-up failed or whose reply was lost
        await self.on_key_revoked(tenant_id, key_id)
        if not revoked:
            raise _key_not_found(key_id, tenant_id)
        return pb.RevokeKeyResponse()

    @grpc_edge
    async def SetWeight(self, request: pb.SetWeightRequest, context: Context) -> pb.Tenant:
        _require_admin()
        tenant_id = _valid_tenant_id(request.tenant_id)
        change = pb.TenantQuota(weight=request.weight)
        return await self._set_quota(tenant_id, change, path="weight")

    @grpc_edge
    async def SetQuota(self, request: pb.SetQuotaRequest, context: Context) -> pb.Tenant:
        _require_admin()
        tenant_id = _valid_tenant_id(request.tenant_id)
        return await self._set_quota(tenant_id, request.quota, path="quota")

    @grpc_edge
    async def GetUsage(self, request: pb.GetUsageRequest, context: Context) -> pb.Usage:
        _require_admin()
        tenant_id = _valid_tenant_id(request.tenant_id)
        return usage_to_proto(tenant_id, await self.store.usage(tenant_id))

    @grpc_edge
    async def GetStatus(self, request: pb.GetStatusRequest, context: Context) -> pb.Status:
        _require_admin()
        if request.max_tenants < 0:
            raise FieldsInvalid([FieldViolation("max_tenants", "must be at least 0")])
        return status_to_proto(self.status(clamp_limit(request.max_tenants)))

    async def _set_quota(self, tenant_id: str, change: pb.TenantQuota, path: str) -> pb.Tenant:
        current = await self.store.get_tenant(tenant_id)
        quota = quota_from_proto(change, current.quota, path)
        return await self._view(await self.store.update_tenant(tenant_id, quota=quota))

    async def _view(self, tenant: Tenant) -> pb.Tenant:
        return tenant_to_proto(tenant, await self.store.list_keys(tenant.tenant_id))


def _require_admin() -> None:
    if CALLER.get(None) != ADMIN:
        raise PermissionDenied("the Admin service needs the admin key")


def _valid_tenant_id(tenant_id: str) -> str:
    with field("tenant_id"):
        return check_tenant_id(tenant_id)


def _valid_key_id(key_id: str) -> str:
    try:
        return check_key_id(key_id)
    except RequestInvalid as exc:
        raise FieldsInvalid([FieldViolation("key_id", str(exc))]) from None


def _find_key(keys: list[ApiKey], key_id: str, tenant_id: str) -> ApiKey:
    for key in keys:
        if key.key_id == key_id:
            return key
    raise _key_not_found(key_id, tenant_id)


def _key_not_found(key_id: str, tenant_id: str) -> NotFound:
    return NotFound(f"key {key_id!r} of tenant {tenant_id!r} not found")


def _page_size(requested: int) -> int:
    if requested < 0:
        raise FieldsInvalid([FieldViolation("page_size", "must be at least 0")])
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _encode_token(last_tenant_id: str) -> str:
    return base64.urlsafe_b64encode(last_tenant_id.encode()).decode()


def _decode_token(token: str) -> str:
    """The last tenant id of the previous page; '' (before every id) for the first page."""
    if not token:
        return ""
    try:
        raw = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True)
        return check_tenant_id(raw.decode("utf-8"))
    except (binascii.Error, UnicodeError, TenantInvalid):
        raise FieldsInvalid(
            [FieldViolation("page_token", "not a token from a previous page")]
        ) from None
