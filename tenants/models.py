"""Tenant records, quota settings and usage snapshots shared by every quota store.

Invariant: a `TenantQuota` that exists is enforceable: limits are non-negative integers (0 means
unlimited where the field says so), the weight is within [MIN_WEIGHT, MAX_WEIGHT], and
`1 <= default_max_tokens <= max_tokens_ceiling`. The defaults bound every count a tenant can
grow (calls, jobs, nodes, prompt size, streams), so a tenant created without a quota cannot take
the whole gateway; the token rate and daily budget are billing terms and stay unlimited until set.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tenants.errors import QuotaInvalid, RequestInvalid, TenantInvalid

DAY_S = 86_400  # daily budgets reset at each UTC midnight: day number = floor(unix_time / DAY_S)
CLOSED_CALL_MEMORY_S = 3_600.0  # how long a closed call id is remembered (refuses re-reserve)
BUSY_RETRY_S = 1.0  # retry hint for count limits (concurrent calls, queued jobs, streams)
MAX_ID_LEN = 256
# the most a quota's token rate or budget may be: exact in Redis' Lua, whose numbers are doubles
MAX_COUNT = 2**53
# the most a quota's other counts may be (the admin API carries them as int32, and a quota the API
# cannot show would fail every view of its tenant), and the most one request of the store may
# count (a call's tokens, a job's nodes: a model's context bounds them). Redis' Lua adds such
# counts in doubles, exact up to 2**53: at 2**53 a request, 1 + 2**53 rounded to 2**53, and the
# twin and Redis parted; at this bound no day's or tenant's sum reaches it (2**22 of the largest)
MAX_NARROW_COUNT = 2**31 - 1
_WIDE_COUNTS = frozenset({"tokens_per_minute", "daily_token_budget"})
MAX_RENEW_IDS = 1_000  # call ids, and job ids, one renew may name
# live keys a tenant may hold: every view of the tenant lists them all (a page of 100 tenants
# holding a thousand each is ~6 MB), and keys issued without end would pass any reply's limit
MAX_KEYS_PER_TENANT = 1_000
# A tenant's service is charged per unit of its weight: at 1e-300 a call of a few million KV
# token-steps charged ~1e306, and some tens of calls overflowed the pool's shared counters
# (infinity: every exchange of the pool failed, and with it every tenant's dispatch). A ratio of
# a million between two tenants is more than any share an operator means.
MIN_WEIGHT, MAX_WEIGHT = 1e-3, 1e3

_TENANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MAX_DISPLAY_NAME = 200


@dataclass(frozen=True, slots=True)
class TenantQuota:
    weight: float = 1.0  # fair-share weight
    tokens_per_minute: int = 0  # token bucket of this capacity, refilled continuously; 0: none
    max_concurrent_calls: int = 64  # open reservations at once; 0: unlimited
    max_queued_jobs: int = 256  # admitted, unfinished jobs; 0: unlimited
    max_nodes_per_job: int = 256  # 0: unlimited
    max_prompt_tokens: int = 8192  # enforced by the gateway on each rendered prompt; 0: unlimited
    max_tokens_ceiling: int = 512  # server-side cap on any call's max_tokens
    default_max_tokens: int = 256  # max_tokens when a call names none
    daily_token_budget: int = 0  # input + output tokens per UTC day; 0: unlimited
    max_streams: int = 64  # open WatchJob/RunJob/Generate streams, gateway-enforced; 0: unlimited

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool) or not isinstance(self.weight, int | float):
            raise QuotaInvalid(f"weight must be a number, got {self.weight!r}")
        if not MIN_WEIGHT <= self.weight <= MAX_WEIGHT:  # NaN is in no range
            raise QuotaInvalid(
                f"weight must be in [{MIN_WEIGHT:g}, {MAX_WEIGHT:g}], got {self.weight}"
            )
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "weight":
                continue
            top = MAX_COUNT if field.name in _WIDE_COUNTS else MAX_NARROW_COUNT
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
                raise QuotaInvalid(f"{field.name} must be an integer in [0, {top}], got {value!r}")
        if self.max_tokens_ceiling < 1:
            raise QuotaInvalid("max_tokens_ceiling must be at least 1")
        if not 1 <= self.default_max_tokens <= self.max_tokens_ceiling:
            raise QuotaInvalid(
                f"default_max_tokens must be in [1, max_tokens_ceiling={self.max_tokens_ceiling}],"
                f" got {self.default_max_tokens}"
            )

    def as_fields(self) -> dict[str, str]:
        """Flat string form (Redis hash fields, settings files)."""
        return {f.name: repr(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> TenantQuota:
        """Inverse of `as_fields`; fields that are absent keep their defaults."""
        values: dict[str, float | int] = {}
        for f in dataclasses.fields(cls):
            if f.name in fields:
                raw = fields[f.name]
                values[f.name] = float(raw) if f.name == "weight" else int(raw)
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Tenant:
    tenant_id: str
    display_name: str
    quota: TenantQuota
    created_at: float  # unix seconds, the store's clock


@dataclass(frozen=True, slots=True)
class ApiKey:
    key_id: str  # public part of the key; the secret is stored only as a SHA-256 digest
    tenant_id: str
    created_at: float


@dataclass(frozen=True, slots=True)
class Reservation:
    call_id: str
    tokens: int  # charged to the token bucket and the daily budget until settled or released
    expires_at: float  # unix seconds, the store's clock; reclaimed (refunded) from then on


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int  # settled totals since the tenant was created
    output_tokens: int
    settled_calls: int
    tokens_today: int  # charged to today's budget: settled use plus open reservations
    active_reservations: int
    reserved_tokens: int  # held by the open reservations
    queued_jobs: int  # admitted and not finished
    bucket_level: float | None  # tokens in the bucket now; None when the rate is unlimited
    as_of: float  # the store's clock when this snapshot was taken


def check_tenant_id(tenant_id: str) -> str:
    if not isinstance(tenant_id, str) or not _TENANT_ID.fullmatch(tenant_id):
        shown = repr(tenant_id)  # its start alone, for a string of any size
        if isinstance(tenant_id, str) and len(tenant_id) > 64:
            shown = repr(tenant_id[:64]) + "..."
        raise TenantInvalid(
            f"tenant id must be 1-64 of [A-Za-z0-9._-], starting alphanumeric; got {shown}"
        )
    return tenant_id


def check_display_name(display_name: str) -> str:
    if not isinstance(display_name, str) or len(display_name) > _MAX_DISPLAY_NAME:
        raise TenantInvalid(f"display name must be a string of at most {_MAX_DISPLAY_NAME} chars")
    return display_name


def check_id(kind: str, value: str) -> str:
    """Call and job ids: any non-empty string up to MAX_ID_LEN characters."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LEN:
        raise RequestInvalid(f"{kind} must be a non-empty string of at most {MAX_ID_LEN} chars")
    return value


def check_ids(kind: str, values: Sequence[str]) -> list[str]:
    """A bounded list of ids: a lone string is refused rather than read as its characters."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise RequestInvalid(f"{kind} must be a sequence of ids, got {type(values).__name__}")
    if len(values) > MAX_RENEW_IDS:
        raise RequestInvalid(f"{kind}: at most {MAX_RENEW_IDS} ids, got {len(values)}")
    return [check_id(kind, value) for value in values]


def check_count(kind: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NARROW_COUNT:
        raise RequestInvalid(f"{kind} must be an integer in [0, 2**31 - 1], got {value!r}")
    return value


def check_ttl(ttl_s: float) -> float:
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float):
        raise RequestInvalid(f"ttl_s must be a number, got {ttl_s!r}")
    if not (math.isfinite(ttl_s) and ttl_s > 0):
        raise RequestInvalid(f"ttl_s must be positive and finite, got {ttl_s}")
    return float(ttl_s)
