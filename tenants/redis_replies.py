"""Turns Redis replies (Lua script results, tenant records) into results and errors.

Each script replies with a list whose first item names the outcome (see the header of each
script in tenants/lua/); refusals become the same QuotaExceeded the in-memory twin raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tenants import refusals
from tenants.errors import CallClosed, QuotaExceeded, TenantNotFound
from tenants.models import Reservation, Tenant, TenantQuota, Usage


def reservation_from(
    tenant_id: str, call_id: str, tokens: int, reply: Sequence[Any]
) -> Reservation:
    match reply[0]:
        case "ok":
            return Reservation(call_id, tokens, float(reply[1]))
        case "open":
            return Reservation(call_id, int(reply[1]), float(reply[2]))
        case "closed":
            raise CallClosed(f"call {call_id!r} is already closed")
        case "no_tenant":
            raise TenantNotFound(f"no tenant {tenant_id!r}")
        case "calls":
            raise refusals.concurrent_calls(tenant_id, int(reply[1]), int(reply[2]))
        case "budget":
            budget, used, now = int(reply[1]), int(reply[2]), float(reply[3])
            raise refusals.daily_budget(tenant_id, budget, used, tokens, now)
        case "rate":
            raise refusals.token_rate(tenant_id, int(reply[1]), float(reply[2]), tokens)
    raise AssertionError(f"reserve.lua replied {reply!r}")


def verdict_of_admission(tenant_id: str, num_nodes: int, reply: Sequence[Any]) -> bool:
    match reply[0]:
        case "ok":
            return True
        case "queued":
            return False
        case "no_tenant":
            raise TenantNotFound(f"no tenant {tenant_id!r}")
        case "nodes":
            raise refusals.nodes_per_job(tenant_id, int(reply[1]), num_nodes)
        case "jobs":
            raise refusals.queued_jobs(tenant_id, int(reply[1]), int(reply[2]))
    raise AssertionError(f"admit_job.lua replied {reply!r}")


def held_after_admission(
    tenant_id: str, num_nodes: int, call_id: str, tokens: int, reply: Sequence[Any]
) -> Reservation | None:
    """admit_and_reserve.lua: admission refusals raise; a refused reservation is None."""
    if reply[0] != "admitted":
        verdict_of_admission(tenant_id, num_nodes, reply)
        raise AssertionError(f"admit_and_reserve.lua replied {reply!r}")
    try:
        return reservation_from(tenant_id, call_id, tokens, reply[1:])
    except (QuotaExceeded, CallClosed):
        return None


def usage_from(tenant_id: str, reply: Sequence[Any]) -> Usage:
    if reply[0] == "no_tenant":
        raise TenantNotFound(f"no tenant {tenant_id!r}")
    assert reply[0] == "ok", reply
    return Usage(
        input_tokens=int(reply[1]),
        output_tokens=int(reply[2]),
        settled_calls=int(reply[3]),
        tokens_today=int(reply[4]),
        active_reservations=int(reply[5]),
        reserved_tokens=int(reply[6]),
        queued_jobs=int(reply[7]),
        bucket_level=float(reply[8]) if reply[8] != "" else None,
        as_of=float(reply[9]),
    )


def decoded(value: bytes | str) -> str:
    assert isinstance(value, str), "the client decodes responses"
    return value


def tenant_from(tenant_id: str, raw: dict[bytes | str, bytes | str]) -> Tenant | None:
    if not raw:
        return None
    record = {decoded(field): decoded(value) for field, value in raw.items()}
    return Tenant(
        tenant_id=tenant_id,
        display_name=record["display_name"],
        quota=TenantQuota.from_fields(record),
        created_at=float(record["created_at"]),
    )
