"""One tenant's quota state in process memory: the arithmetic of the in-memory twin.

Sans-I/O: every method takes `now` and the tenant's current quota and returns a decision; the
Lua scripts in tenants/lua/ do the same arithmetic inside Redis. Token bucket: capacity and rate
are `tokens_per_minute` (refill `rate / 60` per second, continuous), the level is brought up to
date lazily, refunds never lift it above capacity, excess use may take it below zero.
Leases: a reservation or an admitted job lives until its expiry, which `renew` pushes on while
the work runs. A reservation that expires is reclaimed (refunded in full) and remembered as
reclaimed, so its settle, should it come late, still charges the actual tokens once.
Invariant: `tokens_today` = the actual tokens of today's settled calls (a late settle counts on
the day it lands) + the tokens of open reservations charged today; every call id is opened at
most once and closed at most once, and charged by at most one settle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tenants import refusals
from tenants.errors import CallClosed
from tenants.models import CLOSED_CALL_MEMORY_S, DAY_S, Reservation, TenantQuota, Usage


@dataclass(slots=True)
class _Open:
    tokens: int
    day: int  # the UTC day whose budget was charged
    expires_at: float


@dataclass(slots=True)
class TenantLedger:
    tenant_id: str
    input_tokens: int = 0
    output_tokens: int = 0
    settled_calls: int = 0
    _bucket_level: float | None = None  # None: never charged, i.e. full
    _bucket_ts: float = 0.0
    _day: int = -1
    _day_used: int = 0
    _open: dict[str, _Open] = field(default_factory=dict)
    _closed: dict[str, float] = field(default_factory=dict)  # call id -> forget at
    _reclaimed: set[str] = field(default_factory=set)  # closed by expiry, not settled since
    _jobs: dict[str, float] = field(default_factory=dict)  # job id -> expires at

    def reserve(
        self, quota: TenantQuota, call_id: str, tokens: int, ttl_s: float, now: float
    ) -> Reservation:
        self._reclaim(quota, now)
        held = self._open.get(call_id)
        if held is not None:
            return Reservation(call_id, held.tokens, held.expires_at)
        if call_id in self._closed:
            raise CallClosed(f"call {call_id!r} is already closed")
        active = len(self._open)
        if 0 < quota.max_concurrent_calls <= active:
            raise refusals.concurrent_calls(self.tenant_id, quota.max_concurrent_calls, active)
        today = int(now // DAY_S)
        used = self._used_on(today)
        if 0 < quota.daily_token_budget < used + tokens:
            raise refusals.daily_budget(self.tenant_id, quota.daily_token_budget, used, tokens, now)
        level = self._level(quota.tokens_per_minute, now)
        if level is not None and level < tokens:
            raise refusals.token_rate(self.tenant_id, quota.tokens_per_minute, level, tokens)
        self._bucket_add(quota.tokens_per_minute, now, -tokens)
        self._day_add(today, tokens)
        self._open[call_id] = _Open(tokens, today, now + ttl_s)
        return Reservation(call_id, tokens, now + ttl_s)

    def settle(
        self, quota: TenantQuota, call_id: str, input_tokens: int, output_tokens: int, now: float
    ) -> bool:
        self._reclaim(quota, now)
        held = self._close(call_id, now)
        actual = input_tokens + output_tokens
        if held is not None:
            self._refund(quota, held.day, held.tokens - actual, now)
        elif call_id in self._reclaimed:
            self._reclaimed.remove(call_id)
            self._refund(quota, int(now // DAY_S), -actual, now)
        else:
            return False
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.settled_calls += 1
        return True

    def release(self, quota: TenantQuota, call_id: str, now: float) -> bool:
        self._reclaim(quota, now)
        held = self._close(call_id, now)
        if held is None:
            return False
        self._refund(quota, held.day, held.tokens, now)
        return True

    def renew(
        self,
        quota: TenantQuota,
        calls: Sequence[str],
        jobs: Sequence[str],
        ttl_s: float,
        now: float,
    ) -> list[str]:
        """Push each open reservation and admitted job named to `now + ttl_s`; the named calls
        that are not open (their lease was lost), in the order given."""
        self._reclaim(quota, now)
        self._prune_jobs(now)
        lost = []
        for call_id in calls:
            held = self._open.get(call_id)
            if held is None:
                lost.append(call_id)
            else:
                held.expires_at = now + ttl_s
        for job_id in jobs:
            if job_id in self._jobs:
                self._jobs[job_id] = now + ttl_s
        return lost

    def admit_job(
        self, quota: TenantQuota, job_id: str, num_nodes: int, ttl_s: float, now: float
    ) -> bool:
        self._prune_jobs(now)
        if job_id in self._jobs:
            return False
        if 0 < quota.max_nodes_per_job < num_nodes:
            raise refusals.nodes_per_job(self.tenant_id, quota.max_nodes_per_job, num_nodes)
        if 0 < quota.max_queued_jobs <= len(self._jobs):
            raise refusals.queued_jobs(self.tenant_id, quota.max_queued_jobs, len(self._jobs))
        self._jobs[job_id] = now + ttl_s
        return True

    def finish_job(self, job_id: str) -> bool:
        return self._jobs.pop(job_id, None) is not None

    def usage(self, quota: TenantQuota, now: float) -> Usage:
        self._reclaim(quota, now)
        self._prune_jobs(now)
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            settled_calls=self.settled_calls,
            tokens_today=self._used_on(int(now // DAY_S)),
            active_reservations=len(self._open),
            reserved_tokens=sum(held.tokens for held in self._open.values()),
            queued_jobs=len(self._jobs),
            bucket_level=self._level(quota.tokens_per_minute, now),
            as_of=now,
        )

    def _reclaim(self, quota: TenantQuota, now: float) -> None:
        """Release expired reservations, marked reclaimed; forget closed ids whose memory has
        run out."""
        expired = [call_id for call_id, held in self._open.items() if held.expires_at <= now]
        for call_id in expired:
            held = self._close(call_id, now)
            assert held is not None
            self._refund(quota, held.day, held.tokens, now)
            self._reclaimed.add(call_id)
        while self._closed:
            call_id, forget_at = next(iter(self._closed.items()))
            if forget_at > now:
                break
            del self._closed[call_id]
            self._reclaimed.discard(call_id)

    def _close(self, call_id: str, now: float) -> _Open | None:
        self._closed.setdefault(call_id, now + CLOSED_CALL_MEMORY_S)
        return self._open.pop(call_id, None)

    def _refund(self, quota: TenantQuota, day: int, refund: int, now: float) -> None:
        """Give `refund` tokens back to the bucket, and to day `day`'s budget if that is today
        (a negative refund charges)."""
        self._bucket_add(quota.tokens_per_minute, now, refund)
        today = int(now // DAY_S)
        if day == today:
            self._day_add(today, -refund)

    def _level(self, rate: int, now: float) -> float | None:
        if rate <= 0:
            return None
        if self._bucket_level is None:
            return float(rate)
        return min(float(rate), self._bucket_level + max(0.0, now - self._bucket_ts) * rate / 60)

    def _bucket_add(self, rate: int, now: float, delta: int) -> None:
        level = self._level(rate, now)
        if level is not None:  # capped as stored: a later, higher rate must not read a burst
            self._bucket_level = min(float(rate), level + delta)
            self._bucket_ts = now

    def _used_on(self, day: int) -> int:
        return self._day_used if self._day == day else 0

    def _day_add(self, day: int, delta: int) -> None:
        self._day_used = self._used_on(day) + delta
        self._day = day

    def _prune_jobs(self, now: float) -> None:
        for job_id in [job for job, expires_at in self._jobs.items() if expires_at <= now]:
            del self._jobs[job_id]
