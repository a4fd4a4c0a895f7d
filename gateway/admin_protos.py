"""The fairgate.v1.Admin service's messages and the tenant models, field by field.

Quota merge rule: a `TenantQuota` proto field that is set replaces the base value, an unset one
keeps it, so one function serves create (base: the server's defaults) and every update (base:
the tenant's current quota). Values the model refuses become `FieldsInvalid` naming the request
field, so the client learns which field to fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from fairgate.v1 import admin_pb2 as pb
from gateway.errors import FieldsInvalid
from gateway.gateway_protos import timestamp
from gateway.jobs.errors import FieldViolation
from tenants import ApiKey, Tenant, TenantQuota, Usage, key_prefix
from tenants.errors import QuotaInvalid, TenantInvalid

QUOTA_FIELDS = tuple(f.name for f in dataclasses.fields(TenantQuota))


@contextmanager
def field(path: str) -> Iterator[None]:
    """Report a model's refusal of a value as a violation of the request field `path`."""
    try:
        yield
    except (QuotaInvalid, TenantInvalid) as exc:
        raise FieldsInvalid([FieldViolation(path, str(exc))]) from None


def quota_from_proto(msg: pb.TenantQuota, base: TenantQuota, path: str = "quota") -> TenantQuota:
    """`base` with the fields set in `msg` replaced."""
    changes = {descriptor.name: value for descriptor, value in msg.ListFields()}
    with field(path):
        return dataclasses.replace(base, **changes)


def quota_to_proto(quota: TenantQuota) -> pb.TenantQuota:
    return pb.TenantQuota(**{name: getattr(quota, name) for name in QUOTA_FIELDS})


def key_to_proto(key: ApiKey, label: str = "") -> pb.ApiKey:
    return pb.ApiKey(
        key_id=key.key_id,
        tenant_id=key.tenant_id,
        label=label,
        prefix=key_prefix(key.key_id),
        create_time=timestamp(key.created_at),
    )


def tenant_to_proto(tenant: Tenant, keys: list[ApiKey]) -> pb.Tenant:
    return pb.Tenant(
        tenant_id=tenant.tenant_id,
        display_name=tenant.display_name,
        quota=quota_to_proto(tenant.quota),
        keys=[key_to_proto(key) for key in keys],
        create_time=timestamp(tenant.created_at),
    )


def usage_to_proto(tenant_id: str, usage: Usage) -> pb.Usage:
    return pb.Usage(
        tenant_id=tenant_id,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        settled_calls=usage.settled_calls,
        tokens_today=usage.tokens_today,
        active_reservations=usage.active_reservations,
        queued_jobs=usage.queued_jobs,
    )
