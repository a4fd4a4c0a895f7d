"""What the Admin service returns, as plain typed objects: tenants, quotas, keys, usage, status.

Each `*_from_proto` maps one fairgate.v1 admin message field by field; timestamps become aware
UTC datetimes, durations float seconds (None when unset). `QuotaFields` names the quota settings
a request may change: keys left out keep their values (they travel as unset proto3 `optional`
fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from google.protobuf.message import Message

from fairgate.results import datetime_from_proto
from fairgate.v1 import admin_pb2 as pb


class QuotaFields(TypedDict, total=False):
    weight: float  # fair-share weight, > 0
    tokens_per_minute: int  # 0: no rate limit
    max_concurrent_calls: int  # 0: unlimited
    max_queued_jobs: int  # 0: unlimited
    max_nodes_per_job: int
    max_prompt_tokens: int
    max_tokens_ceiling: int
    default_max_tokens: int
    daily_token_budget: int  # prompt + output tokens per UTC day; 0: unlimited
    max_streams: int  # open WatchJob/RunJob/Generate streams; 0: unlimited


@dataclass(frozen=True, slots=True)
class Quota:
    weight: float
    tokens_per_minute: int
    max_concurrent_calls: int
    max_queued_jobs: int
    max_nodes_per_job: int
    max_prompt_tokens: int
    max_tokens_ceiling: int
    default_max_tokens: int
    daily_token_budget: int
    max_streams: int


@dataclass(frozen=True, slots=True)
class ApiKey:
    key_id: str
    tenant_id: str
    label: str
    prefix: str  # the key's first characters, to recognise it
    create_time: datetime | None


@dataclass(frozen=True, slots=True)
class IssuedKey:
    key: ApiKey
    plaintext: str  # shown this once; send it as `authorization: Bearer <plaintext>`


@dataclass(frozen=True, slots=True)
class Tenant:
    tenant_id: str
    display_name: str
    quota: Quota
    keys: tuple[ApiKey, ...]  # live keys, never their secrets
    create_time: datetime | None


@dataclass(frozen=True, slots=True)
class TenantPage:
    tenants: tuple[Tenant, ...]  # ordered by tenant_id
    next_page_token: str  # empty on the last page


@dataclass(frozen=True, slots=True)
class Usage:
    tenant_id: str
    input_tokens: int  # settled totals
    output_tokens: int
    settled_calls: int
    tokens_today: int  # counted against today's daily_token_budget
    active_reservations: int
    queued_jobs: int


@dataclass(frozen=True, slots=True)
class TenantStatus:
    """One active tenant now; shares and latencies over the status's window."""

    tenant_id: str
    weight: float
    queued_jobs: int  # active jobs with no call on a backend
    running_jobs: int  # active jobs with a call on a backend
    ready_calls: int  # waiting for a backend (or their quota reservation)
    running_calls: int
    served_kv_token_steps: float  # KV token-time served in the window, running calls included
    served_share: float  # its part of all active tenants' service (0..1)
    fair_share: float  # its weight over the active tenants' weights (0..1)
    window_calls: int  # its calls that ended in the window
    ttft_p50_s: float | None  # from ready to the first token; None: no call in the window
    ttft_p99_s: float | None
    queue_wait_p50_s: float | None  # from ready to running
    queue_wait_p99_s: float | None


@dataclass(frozen=True, slots=True)
class BackendStatus:
    name: str
    model: str
    running: int
    waiting: int
    kv_usage: float | None  # KV blocks in use (0..1); None: the backend does not say
    healthy: bool


@dataclass(frozen=True, slots=True)
class GatewayStatus:
    time: datetime | None
    window_s: float  # shares and latencies are over this last window
    tenants: tuple[TenantStatus, ...]  # the most active first
    active_tenants: int  # listed or not
    backends: tuple[BackendStatus, ...]
    overload_level: int  # 0: normal; higher: the SLO monitor's degradation step
    overload_reason: str


def quota_to_proto(fields: QuotaFields) -> pb.TenantQuota:
    return pb.TenantQuota(**fields)


def quota_from_proto(msg: pb.TenantQuota) -> Quota:
    return Quota(
        weight=msg.weight,
        tokens_per_minute=msg.tokens_per_minute,
        max_concurrent_calls=msg.max_concurrent_calls,
        max_queued_jobs=msg.max_queued_jobs,
        max_nodes_per_job=msg.max_nodes_per_job,
        max_prompt_tokens=msg.max_prompt_tokens,
        max_tokens_ceiling=msg.max_tokens_ceiling,
        default_max_tokens=msg.default_max_tokens,
        daily_token_budget=msg.daily_token_budget,
        max_streams=msg.max_streams,
    )


def key_from_proto(msg: pb.ApiKey) -> ApiKey:
    create_time = datetime_from_proto(msg, "create_time")
    return ApiKey(msg.key_id, msg.tenant_id, msg.label, msg.prefix, create_time)


def tenant_from_proto(msg: pb.Tenant) -> Tenant:
    return Tenant(
        tenant_id=msg.tenant_id,
        display_name=msg.display_name,
        quota=quota_from_proto(msg.quota),
        keys=tuple(key_from_proto(key) for key in msg.keys),
        create_time=datetime_from_proto(msg, "create_time"),
    )


def usage_from_proto(msg: pb.Usage) -> Usage:
    return Usage(
        tenant_id=msg.tenant_id,
        input_tokens=msg.input_tokens,
        output_tokens=msg.output_tokens,
        settled_calls=msg.settled_calls,
        tokens_today=msg.tokens_today,
        active_reservations=msg.active_reservations,
        queued_jobs=msg.queued_jobs,
    )


def status_from_proto(msg: pb.Status) -> GatewayStatus:
    return GatewayStatus(
        time=datetime_from_proto(msg, "time"),
        window_s=seconds_from_proto(msg, "window") or 0.0,
        tenants=tuple(tenant_status_from_proto(t) for t in msg.tenants),
        active_tenants=msg.active_tenants,
        backends=tuple(backend_status_from_proto(b) for b in msg.backends),
        overload_level=msg.overload_level,
        overload_reason=msg.overload_reason,
    )


def tenant_status_from_proto(msg: pb.TenantStatus) -> TenantStatus:
    return TenantStatus(
        tenant_id=msg.tenant_id,
        weight=msg.weight,
        queued_jobs=msg.queued_jobs,
        running_jobs=msg.running_jobs,
        ready_calls=msg.ready_calls,
        running_calls=msg.running_calls,
        served_kv_token_steps=msg.served_kv_token_steps,
        served_share=msg.served_share,
        fair_share=msg.fair_share,
        window_calls=msg.window_calls,
        ttft_p50_s=seconds_from_proto(msg, "ttft_p50"),
        ttft_p99_s=seconds_from_proto(msg, "ttft_p99"),
        queue_wait_p50_s=seconds_from_proto(msg, "queue_wait_p50"),
        queue_wait_p99_s=seconds_from_proto(msg, "queue_wait_p99"),
    )


def backend_status_from_proto(msg: pb.BackendStatus) -> BackendStatus:
    kv_usage = msg.kv_usage if msg.HasField("kv_usage") else None
    return BackendStatus(msg.name, msg.model, msg.running, msg.waiting, kv_usage, msg.healthy)


def seconds_from_proto(parent: Message, field: str) -> float | None:
    """A Duration field in seconds; None when unset."""
    if not parent.HasField(field):
        return None
    nanoseconds: int = getattr(parent, field).ToNanoseconds()
    return nanoseconds / 1e9
