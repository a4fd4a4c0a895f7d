"""The QuotaExceeded each limit raises, with its retry hint; shared by every quota store.

Retry hints: the token bucket refills at `tokens_per_minute / 60` per second, so a call of `t`
tokens fits again after `(t - level) * 60 / rate` seconds; the daily budget frees at the next UTC
midnight; count limits (concurrent calls, queued jobs and their characters, open streams,
submissions and RPCs under way) free when someone finishes, which nobody can predict, so they hint
`BUSY_RETRY_S`. A request larger
than the limit itself gets no hint (`retry_after_s=None`): waiting cannot help.
"""

from __future__ import annotations

from tenants.errors import QuotaExceeded, QuotaLimit
from tenants.models import BUSY_RETRY_S, DAY_S


def _count(
    tenant_id: str, which: QuotaLimit, limit: int, in_use: int, description: str
) -> QuotaExceeded:
    """A count limit that one more would pass: it frees when someone finishes."""
    return QuotaExceeded(
        tenant_id=tenant_id,
        limit=which,
        allowed=limit,
        requested=in_use + 1,
        description=description,
        retry_after_s=BUSY_RETRY_S,
    )


def concurrent_calls(tenant_id: str, limit: int, active: int) -> QuotaExceeded:
    description = f"at most {limit} concurrent calls; {active} are running"
    return _count(tenant_id, QuotaLimit.CONCURRENT_CALLS, limit, active, description)


def daily_budget(tenant_id: str, budget: int, used: int, tokens: int, now: float) -> QuotaExceeded:
    retry = None if tokens > budget else DAY_S - now % DAY_S
    return QuotaExceeded(
        tenant_id=tenant_id,
        limit=QuotaLimit.DAILY_BUDGET,
        allowed=budget,
        requested=tokens,
        description=f"daily budget of {budget} tokens: {used} used today, {tokens} requested",
        retry_after_s=retry,
    )


def token_rate(tenant_id: str, rate: int, level: float, tokens: int) -> QuotaExceeded:
    retry = None if tokens > rate else max(0.0, (tokens - level) * 60.0 / rate)
    return QuotaExceeded(
        tenant_id=tenant_id,
        limit=QuotaLimit.TOKEN_RATE,
        allowed=rate,
        requested=tokens,
        description=(
            f"token rate of {rate} per minute: {tokens} requested, {max(level, 0.0):.0f} available"
        ),
        retry_after_s=retry,
    )


def queued_jobs(tenant_id: str, limit: int, queued: int) -> QuotaExceeded:
    description = f"at most {limit} queued jobs; {queued} are queued"
    return _count(tenant_id, QuotaLimit.QUEUED_JOBS, limit, queued, description)


def queued_chars(tenant_id: str, limit: int, held: int, chars: int) -> QuotaExceeded:
    """A job whose characters would take its tenant's queued jobs past `limit`: it fits once
    some of them end, unless it is larger than the limit itself."""
    return QuotaExceeded(
        tenant_id=tenant_id,
        limit=QuotaLimit.QUEUED_CHARS,
        allowed=limit,
        requested=held + chars,
        description=(
            f"at most {limit:,} characters in queued jobs (inputs and prompts); {held:,} are"
            f" queued and this job holds {chars:,}"
        ),
        retry_after_s=None if chars > limit else BUSY_RETRY_S,
    )


def nodes_per_job(tenant_id: str, limit: int, num_nodes: int) -> QuotaExceeded:
    return QuotaExceeded(
        tenant_id=tenant_id,
        limit=QuotaLimit.NODES_PER_JOB,
        allowed=limit,
        requested=num_nodes,
        description=f"at most {limit} nodes per job; this job has {num_nodes}",
        retry_after_s=None,
    )


def admissions(tenant_id: str, limit: int, in_flight: int) -> QuotaExceeded:
    description = f"at most {limit} job submissions under way at once; {in_flight} are"
    return _count(tenant_id, QuotaLimit.ADMISSIONS, limit, in_flight, description)


def streams(tenant_id: str, limit: int, open_streams: int) -> QuotaExceeded:
    description = f"at most {limit} open streams; {open_streams} are open"
    return _count(tenant_id, QuotaLimit.STREAMS, limit, open_streams, description)


def rpcs(tenant_id: str, limit: int, in_flight: int) -> QuotaExceeded:
    description = f"at most {limit} RPCs under way at once; {in_flight} are"
    return _count(tenant_id, QuotaLimit.RPCS, limit, in_flight, description)
