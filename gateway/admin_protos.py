"""The fairgate.v1.Admin service's messages and the tenant models and status, field by field.

Quota merge rule: a `TenantQuota` proto field that is set replaces the base value, an unset one
keeps it, so one function serves create (base: the server's defaults) and every update (base:
the tenant's current quota). Values the model refuses become `FieldsInvalid` naming the request
field, so the client learns which field to fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from google.protobuf.duration_pb2 import Duration

from fairgate.v1 import admin_pb2 as pb
from gateway.errors import FieldsInvalid
from gateway.gateway_protos import timestamp
from gateway.jobs.errors import FieldViolation
from gateway.status import BackendStatus, Status, TenantStatus
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


def status_to_proto(status: Status) -> pb.Status:
    return pb.Status(
        time=timestamp(status.time),
        window=duration(status.window_s),
        tenants=[tenant_status_to_proto(t) for t in status.tenants],
        active_tenants=status.active_tenants,
        backends=[backend_status_to_proto(b) for b in status.backends],
        overload_level=status.overload_level,
        overload_reason=status.overload_reason,
    )


def tenant_status_to_proto(tenant: TenantStatus) -> pb.TenantStatus:
    return pb.TenantStatus(
        tenant_id=tenant.tenant_id,
        weight=tenant.weight,
        queued_jobs=tenant.queued_jobs,
        running_jobs=tenant.running_jobs,
        ready_calls=tenant.ready_calls,
        running_calls=tenant.running_calls,
        served_kv_token_steps=tenant.served_kv_token_steps,
        served_share=tenant.served_share,
        fair_share=tenant.fair_share,
        window_calls=tenant.window_calls,
        ttft_p50=duration(tenant.ttft_p50_s),
        ttft_p99=duration(tenant.ttft_p99_s),
        queue_wait_p50=duration(tenant.queue_wait_p50_s),
        queue_wait_p99=duration(tenant.queue_wait_p99_s),
    )


def backend_status_to_proto(backend: BackendStatus) -> pb.BackendStatus:
    return pb.BackendStatus(
        name=backend.name,
        model=backend.model,
        running=backend.running,
        waiting=backend.waiting,
        kv_usage=backend.kv_usage,
        healthy=backend.healthy,
    )


def duration(seconds: float | None) -> Duration | None:
    """A duration of `seconds` (>= 0); None stays unset."""
    if seconds is None:
        return None
    value = Duration()
    value.FromNanoseconds(round(seconds * 1e9))
    return value
