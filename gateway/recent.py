"""Each tenant's recent calls: what `Admin.GetStatus` reports over a sliding window.

A call that ran adds one sample at its end: the KV token-time it held (docs/ARCHITECTURE.md §3),
its time to first token counted from ready (the gateway's fair queue included, as the tenant
waits it) and its queue wait (from ready to running). `view(now)` gives each tenant's service
received and calls in the last `window_s` seconds, `latencies(tenant, now)` the nearest-rank p50
and p99 of its latencies there (asked only for the tenants shown: it sorts). Bounded whatever the
load: service and call counts are summed per second (at most `window_s` + 1 sums a tenant),
latencies keep the newest `max_samples` a tenant, and at most `max_tenants` tenants are kept, the
least recently active dropped first. Samples leave the window as `now` passes them; a tenant with
none left is forgotten.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.job_run import NodeRun
from tenants.policies import kv_token_time

WINDOW_S = 60.0
MAX_SAMPLES = 256
MAX_TENANTS = 1000


@dataclass(frozen=True, slots=True)
class TenantWindow:
    """One tenant's calls that ended in the window."""

    served_kv_token_steps: float
    calls: int


@dataclass(frozen=True, slots=True)
class Latencies:
    """Nearest-rank percentiles over a tenant's calls in the window; None: no sample."""

    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    queue_wait_p50_s: float | None = None
    queue_wait_p99_s: float | None = None


@dataclass(slots=True)
class _Samples:
    seconds: deque[list[float]] = field(default_factory=deque)  # [second, kv, calls], in order
    ttft: deque[tuple[float, float]] = field(default_factory=deque)  # (end, seconds)
    queue_wait: deque[tuple[float, float]] = field(default_factory=deque)


class RecentCalls:
    def __init__(
        self,
        window_s: float = WINDOW_S,
        max_samples: int = MAX_SAMPLES,
        max_tenants: int = MAX_TENANTS,
    ) -> None:
        if window_s <= 0 or max_samples < 1 or max_tenants < 1:
            raise ValueError("window_s, max_samples and max_tenants must be positive")
        self.window_s = window_s
        self.max_samples = max_samples
        self.max_tenants = max_tenants
        self._tenants: OrderedDict[str, _Samples] = OrderedDict()  # least recently active first

    def call_ended(self, tenant_id: str, node: NodeRun, produced: int) -> None:
        """Record a call at its end; one that never reached a backend held nothing."""
        if node.started_at is None or node.finished_at is None:
            return
        ttft = None
        if node.ready_at is not None and node.first_token_at is not None:
            ttft = max(node.first_token_at - node.ready_at, 0.0)
        kv = kv_token_time(node.prompt_tokens, produced)
        self.add(tenant_id, node.finished_at, kv, ttft, node.queue_wait)

    def add(
        self,
        tenant_id: str,
        now: float,
        kv_token_steps: float,
        ttft_s: float | None = None,
        queue_wait_s: float | None = None,
    ) -> None:
        samples = self._tenants.get(tenant_id)
        if samples is None:
            samples = self._tenants[tenant_id] = _Samples()
            if len(self._tenants) > self.max_tenants:
                self._tenants.popitem(last=False)
        self._tenants.move_to_end(tenant_id)
        _expire(samples, now - self.window_s)
        second = math.floor(now)
        if samples.seconds and samples.seconds[-1][0] == second:
            samples.seconds[-1][1] += kv_token_steps
            samples.seconds[-1][2] += 1
        else:
            samples.seconds.append([second, kv_token_steps, 1])
        for kept, value in ((samples.ttft, ttft_s), (samples.queue_wait, queue_wait_s)):
            if value is not None:
                kept.append((now, value))
                if len(kept) > self.max_samples:
                    kept.popleft()

    def forget(self, tenant_id: str) -> None:
        """A deleted tenant's calls leave the window at once."""
        self._tenants.pop(tenant_id, None)

    def view(self, now: float) -> dict[str, TenantWindow]:
        """Every tenant with calls in the window ending at `now`; older samples are dropped."""
        start = now - self.window_s
        summary = {}
        for tenant_id in list(self._tenants):
            samples = self._tenants[tenant_id]
            _expire(samples, start)
            if not samples.seconds:
                del self._tenants[tenant_id]
                continue
            summary[tenant_id] = TenantWindow(
                served_kv_token_steps=sum(kv for _, kv, _ in samples.seconds),
                calls=int(sum(calls for _, _, calls in samples.seconds)),
            )
        return summary

    def latencies(self, tenant_id: str, now: float) -> Latencies:
        samples = self._tenants.get(tenant_id)
        if samples is None:
            return Latencies()
        _expire(samples, now - self.window_s)
        ttft = sorted(value for _, value in samples.ttft)
        wait = sorted(value for _, value in samples.queue_wait)
        return Latencies(
            percentile(ttft, 0.50),
            percentile(ttft, 0.99),
            percentile(wait, 0.50),
            percentile(wait, 0.99),
        )


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The nearest-rank q-quantile of ascending values; None for none."""
    if not ordered:
        return None
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def _expire(samples: _Samples, start: float) -> None:
    """Drop what ended before `start`; a second's sum leaves once all of it has."""
    while samples.seconds and samples.seconds[0][0] + 1 <= start:
        samples.seconds.popleft()
    for kept in (samples.ttft, samples.queue_wait):
        while kept and kept[0][0] < start:
            kept.popleft()
