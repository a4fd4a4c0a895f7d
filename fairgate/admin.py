"""The async client of the fairgate Admin service: tenants, keys, weights, quotas, usage, status.

Usage:

    async with AdminClient("127.0.0.1:50051", admin_key) as admin:
        await admin.create_tenant("acme", "Acme Corp", tokens_per_minute=60_000)
        key = await admin.issue_key("acme", label="ci")
        print(key.plaintext)  # shown once

Quota settings are keyword arguments (`QuotaFields`): the ones given change, the others keep
their values (on create: the server's defaults). Failures raise `fairgate.errors` classes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from functools import cached_property
from typing import Unpack

from fairgate.admin_results import (
    GatewayStatus,
    IssuedKey,
    QuotaFields,
    Tenant,
    TenantPage,
    Usage,
    key_from_proto,
    quota_to_proto,
    status_from_proto,
    tenant_from_proto,
    usage_from_proto,
)
from fairgate.connection import Connection
from fairgate.v1 import admin_pb2 as pb
from fairgate.v1 import admin_pb2_grpc


class AdminClient(Connection):
    """An operator's connection to the Admin service: `AdminClient(target, admin_key)`."""

    @cached_property
    def _admin(self) -> admin_pb2_grpc.AdminStub:
        return admin_pb2_grpc.AdminStub(self.channel)

    async def create_tenant(
        self, tenant_id: str, display_name: str = "", **quota: Unpack[QuotaFields]
    ) -> Tenant:
        request = pb.CreateTenantRequest(
            tenant_id=tenant_id, display_name=display_name, quota=quota_to_proto(quota)
        )
        return tenant_from_proto(await self.unary(self._admin.CreateTenant, request))

    async def get_tenant(self, tenant_id: str) -> Tenant:
        request = pb.GetTenantRequest(tenant_id=tenant_id)
        return tenant_from_proto(await self.unary(self._admin.GetTenant, request))

    async def list_tenants_page(self, page_size: int = 0, page_token: str = "") -> TenantPage:
        """One page (`page_size` 0: the server's default), ordered by tenant id."""
        request = pb.ListTenantsRequest(page_size=page_size, page_token=page_token)
        response = await self.unary(self._admin.ListTenants, request)
        tenants = tuple(tenant_from_proto(t) for t in response.tenants)
        return TenantPage(tenants, response.next_page_token)

    async def list_tenants(self, page_size: int = 0) -> AsyncGenerator[Tenant, None]:
        """Every tenant, fetching pages as the iteration goes."""
        token = ""
        while True:
            page = await self.list_tenants_page(page_size, token)
            for tenant in page.tenants:
                yield tenant
            if not page.next_page_token:
                return
            token = page.next_page_token

    async def update_tenant(
        self, tenant_id: str, *, display_name: str | None = None, **quota: Unpack[QuotaFields]
    ) -> Tenant:
        """Change the display name (when given) and the quota settings given."""
        request = pb.UpdateTenantRequest(tenant_id=tenant_id, display_name=display_name)
        if quota:
            request.quota.CopyFrom(quota_to_proto(quota))
        return tenant_from_proto(await self.unary(self._admin.UpdateTenant, request))

    async def delete_tenant(self, tenant_id: str) -> None:
        """Delete the tenant and its keys; the server cancels its running jobs."""
        await self.unary(self._admin.DeleteTenant, pb.DeleteTenantRequest(tenant_id=tenant_id))

    async def issue_key(self, tenant_id: str, label: str = "") -> IssuedKey:
        request = pb.IssueKeyRequest(tenant_id=tenant_id, label=label)
        response = await self.unary(self._admin.IssueKey, request)
        return IssuedKey(key_from_proto(response.key), response.plaintext)

    async def revoke_key(self, tenant_id: str, key_id: str) -> None:
        request = pb.RevokeKeyRequest(tenant_id=tenant_id, key_id=key_id)
        await self.unary(self._admin.RevokeKey, request)

    async def set_weight(self, tenant_id: str, weight: float) -> Tenant:
        request = pb.SetWeightRequest(tenant_id=tenant_id, weight=weight)
        return tenant_from_proto(await self.unary(self._admin.SetWeight, request))

    async def set_quota(self, tenant_id: str, **quota: Unpack[QuotaFields]) -> Tenant:
        request = pb.SetQuotaRequest(tenant_id=tenant_id, quota=quota_to_proto(quota))
        return tenant_from_proto(await self.unary(self._admin.SetQuota, request))

    async def get_usage(self, tenant_id: str) -> Usage:
        request = pb.GetUsageRequest(tenant_id=tenant_id)
        return usage_from_proto(await self.unary(self._admin.GetUsage, request))

    async def get_status(self, max_tenants: int = 0) -> GatewayStatus:
        """The gateway now: the most active tenants (`max_tenants` 0: the server's default),
        every backend's load and the overload level."""
        request = pb.GetStatusRequest(max_tenants=max_tenants)
        return status_from_proto(await self.unary(self._admin.GetStatus, request))
