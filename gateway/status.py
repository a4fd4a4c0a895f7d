"""The gateway's status now, as `Admin.GetStatus` reports it and `fairgate top` shows it.

`observe(dispatcher, tenants)` reads what the dispatcher holds, and nothing else: its active jobs,
each pool's ready, taking and running calls, every backend's capacity, the weight each tenant's
jobs were admitted with. `build_status` joins that with the recent window (`gateway.recent`)
into a plain `Status`: no I/O, no clock, the same answer for the same inputs. A tenant is active
while it has jobs or received service in the window. Its service is the KV token-time of its
calls that ended in the window plus what its running calls have held so far; its served share is
its part of all active tenants' service, its fair share its weight over theirs. Tenants are
listed the most active first (calls ready or running, then jobs, then service) and cut to
`limit` after the shares are computed over all; latencies are asked for the listed ones only.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.dispatch import Dispatcher
from gateway.recent import Latencies, TenantWindow
from gateway.slo import LEVEL_NAMES
from tenants import TenantQuota
from tenants.policies import kv_token_time

if TYPE_CHECKING:
    from gateway.backends import BackendCapacity

DEFAULT_TENANTS = 20
MAX_TENANTS = 200
DEFAULT_WEIGHT = TenantQuota().weight


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's work in the dispatcher now."""

    queued_jobs: int = 0  # active jobs with no call on a backend
    running_jobs: int = 0  # active jobs with a call on a backend
    ready_calls: int = 0  # waiting for room or for their quota reservation
    running_calls: int = 0
    running_kv_token_steps: float = 0.0  # held so far by its running calls


@dataclass(frozen=True, slots=True)
class BackendStatus:
    name: str
    model: str  # the model it serves
    running: int
    waiting: int
    kv_usage: float | None  # KV blocks in use (0..1); None: the backend does not say
    healthy: bool


@dataclass(frozen=True, slots=True)
class Observed:
    """What the dispatcher holds now, as `build_status` needs it."""

    loads: dict[str, TenantLoad]  # tenants with active jobs or running calls
    weights: dict[str, float]  # of the tenants loaded or asked for
    backends: tuple[BackendStatus, ...]


@dataclass(frozen=True, slots=True)
class TenantStatus:
    tenant_id: str
    weight: float
    queued_jobs: int
    running_jobs: int
    ready_calls: int
    running_calls: int
    served_kv_token_steps: float  # in the window, running calls included
    served_share: float  # of every active tenant's service (0..1)
    fair_share: float  # its weight over the active tenants' (0..1)
    window_calls: int  # its calls that ended in the window
    ttft_p50_s: float | None = None  # from ready to the first token; None: no call in the window
    ttft_p99_s: float | None = None
    queue_wait_p50_s: float | None = None  # from ready to running
    queue_wait_p99_s: float | None = None


@dataclass(frozen=True, slots=True)
class Status:
    time: float  # the dispatcher's clock
    window_s: float
    tenants: tuple[TenantStatus, ...]  # the most active first, at most the limit asked
    active_tenants: int  # listed or not
    backends: tuple[BackendStatus, ...]
    overload_level: int = 0  # 0: normal; higher: the SLO monitor's degradation step
    overload_reason: str = ""


def snapshot(dispatcher: Dispatcher, limit: int = DEFAULT_TENANTS) -> Status:
    """The dispatcher's status now, its calls of the last window included (when it records
    metrics)."""
    now = dispatcher.clock()
    recent = dispatcher.metrics.recent if dispatcher.metrics is not None else None
    window = recent.view(now) if recent is not None else {}
    window_s = recent.window_s if recent is not None else 0.0
    latencies = _no_latencies if recent is None else functools.partial(recent.latencies, now=now)
    overload = dispatcher.overload
    level = overload.level if overload is not None else 0
    reason = LEVEL_NAMES[level] if overload is not None else ""
    observed = observe(dispatcher, window)
    return build_status(observed, window, latencies, now, window_s, limit, level, reason)


def observe(dispatcher: Dispatcher, tenants: Iterable[str] = ()) -> Observed:
    """Read the dispatcher's jobs, calls and backends; the weights of `tenants` too."""
    jobs: defaultdict[str, set[str]] = defaultdict(set)
    for run in dispatcher.runs.values():
        if not run.ended:
            jobs[run.tenant_id].add(run.job_id)
    ready: defaultdict[str, int] = defaultdict(int)
    running: defaultdict[str, int] = defaultdict(int)
    held: defaultdict[str, float] = defaultdict(float)
    busy_jobs: defaultdict[str, set[str]] = defaultdict(set)
    backends = []
    for lane in dispatcher.lanes.values():
        core = lane.core
        for entry in (*core.ready.values(), *core.taking.values()):
            ready[entry.call.tenant_id] += 1
        for entry in core.running.values():
            call = entry.call
            running[call.tenant_id] += 1
            busy_jobs[call.tenant_id].add(call.job_id)
            job = dispatcher.runs.get(call.job_id)  # gone: it ended while the call ends
            produced = job.nodes[call.node_id].output_tokens if job is not None else 0
            held[call.tenant_id] += kv_token_time(call.prompt_tokens, produced)
        for name, backend in lane.backends.items():
            backends.append(_backend_status(name, backend.model, backend.capacity()))
    loads = {}
    for tenant in jobs.keys() | running.keys() | ready.keys():
        active, busy = jobs[tenant], busy_jobs[tenant] & jobs[tenant]
        loads[tenant] = TenantLoad(
            queued_jobs=len(active - busy),
            running_jobs=len(busy),
            ready_calls=ready[tenant],
            running_calls=running[tenant],
            running_kv_token_steps=held[tenant],
        )
    # the quota each tenant's latest job was admitted with: the weight its policy uses
    weights = {}
    for tenant in loads.keys() | set(tenants):
        quota = dispatcher.quota(tenant)
        weights[tenant] = quota.weight if quota is not None else DEFAULT_WEIGHT
    return Observed(loads, weights, tuple(backends))


def _backend_status(name: str, model: str, cap: BackendCapacity) -> BackendStatus:
    return BackendStatus(name, model, cap.running, cap.waiting, cap.kv_usage, cap.healthy)


def build_status(
    observed: Observed,
    window: Mapping[str, TenantWindow],
    latencies: Callable[[str], Latencies],
    now: float,
    window_s: float,
    limit: int = DEFAULT_TENANTS,
    overload_level: int = 0,
    overload_reason: str = "",
) -> Status:
    """Join the dispatcher's state with the window; tenants cut to `limit` (capped), then the
    latencies of those listed asked for."""
    idle = TenantLoad()
    active = sorted(observed.loads.keys() | window.keys())
    served = {
        t: observed.loads.get(t, idle).running_kv_token_steps
        + (window[t].served_kv_token_steps if t in window else 0.0)
        for t in active
    }
    weights = {t: observed.weights.get(t, DEFAULT_WEIGHT) for t in active}
    total_served, total_weight = sum(served.values()), sum(weights.values())
    tenants = []
    for tenant in active:
        load = observed.loads.get(tenant, idle)
        recent = window.get(tenant)
        tenants.append(
            TenantStatus(
                tenant_id=tenant,
                weight=weights[tenant],
                queued_jobs=load.queued_jobs,
                running_jobs=load.running_jobs,
                ready_calls=load.ready_calls,
                running_calls=load.running_calls,
                served_kv_token_steps=served[tenant],
                served_share=served[tenant] / total_served if total_served else 0.0,
                fair_share=weights[tenant] / total_weight if total_weight else 0.0,
                window_calls=recent.calls if recent is not None else 0,
            )
        )
    tenants.sort(key=_activity)
    listed = [_with(t, latencies(t.tenant_id)) for t in tenants[: clamp_limit(limit)]]
    return Status(
        time=now,
        window_s=window_s,
        tenants=tuple(listed),
        active_tenants=len(active),
        backends=observed.backends,
        overload_level=overload_level,
        overload_reason=overload_reason,
    )


def clamp_limit(requested: int) -> int:
    """How many tenants a reply lists: 0 (or less) the default, never above the cap."""
    return min(requested if requested > 0 else DEFAULT_TENANTS, MAX_TENANTS)


def _activity(t: TenantStatus) -> tuple[int, int, float, str]:
    calls, jobs = t.ready_calls + t.running_calls, t.queued_jobs + t.running_jobs
    return (-calls, -jobs, -t.served_kv_token_steps, t.tenant_id)


def _with(tenant: TenantStatus, latencies: Latencies) -> TenantStatus:
    return dataclasses.replace(
        tenant,
        ttft_p50_s=latencies.ttft_p50_s,
        ttft_p99_s=latencies.ttft_p99_s,
        queue_wait_p50_s=latencies.queue_wait_p50_s,
        queue_wait_p99_s=latencies.queue_wait_p99_s,
    )


def _no_latencies(tenant_id: str) -> Latencies:
    return Latencies()
