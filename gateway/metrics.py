"""The gateway's Prometheus metrics: what each tenant got, how long it waited, backends' load.

Counters and histograms are recorded where a call or a job ends (the dispatcher calls
`call_ended`, `job_ended`, `refused`); gauges are read from the dispatcher and its backends when
scraped (`DispatchCollector`), so the hot path pays nothing for them. A scrape reads those on
the event loop and writes the whole text in a worker thread (`exposition`): a thousand tenants'
series take most of a second to write, which would stall every tenant's calls. Names and units
follow Prometheus' guide (`_total`, `_seconds`, `_ratio`). The tenant label is bounded: the
first `max_tenants` tenants seen keep their id, later ones are counted as `_other`, so a tenant
churn cannot grow the registry without end; a deleted tenant's series go and free its place,
and what its last calls do as they end counts as `_other` (until it is admitted a job again).
Settled tokens count what the calls' quota settled (nodes SUCCEEDED or CAPPED, and calls its
tenant's side cut short, for the tokens they made), the same as the store's usage. Each ended
call also joins `recent`, the sliding window `Admin.GetStatus` reports (`gateway/recent.py`).
"""

from __future__ import annotations

import contextlib
import gzip
from collections import Counter as Tally
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

import anyio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from gateway.genai_metrics import GenAiMetrics
from gateway.job_run import CallTimes, JobRun, NodeRun, NodeState
from gateway.recent import RecentCalls
from tenants.redis_client import round_trips

if TYPE_CHECKING:
    from gateway.dispatch import Dispatcher

MAX_TENANTS = 1000
OTHER = "_other"  # no tenant id starts so: a tenant named "other" is not the overflow
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# At 1,000 tenants a scrape is about 4.7 MB of text: level 6 makes it 230 KB in ~30 ms on 2
# cores (level 1: 280 KB, 9 ms; 9, gzip's own default: 223 KB, 125 ms)
_GZIP_LEVEL = 6


class GatewayMetrics:
    def __init__(self, max_tenants: int = MAX_TENANTS, genai: GenAiMetrics | None = None) -> None:
        self.genai = genai  # the OpenTelemetry GenAI metrics, when they are exported
        self.recent = RecentCalls()  # each tenant's last minute of calls, for Admin.GetStatus
        self.registry = CollectorRegistry()
        self.max_tenants = max_tenants
        self._tenants: set[str] = set()
        self._dispatch: DispatchCollector | None = None
        self._gone: OrderedDict[str, None] = OrderedDict()  # deleted tenants, the newest last
        r = self.registry
        self.jobs = Counter("fairgate_jobs", "Jobs by final state", ["tenant", "state"], registry=r)
        self.calls = Counter(
            "fairgate_calls", "Calls by final state", ["tenant", "state"], registry=r
        )
        self.input_tokens = Counter(
            "fairgate_input_tokens", "Prompt tokens of settled calls", ["tenant"], registry=r
        )
        self.output_tokens = Counter(
            "fairgate_output_tokens", "Output tokens of settled calls", ["tenant"], registry=r
        )
        self.queue_wait = Histogram(
            "fairgate_queue_wait_seconds",
            "From ready to running in the engine",
            ["tenant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "fairgate_time_to_first_token_seconds",
            "From running to the first token",
            ["tenant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "fairgate_time_per_output_token_seconds",
            "Between output tokens after the first",
            ["tenant"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.refusals = Counter(
            "fairgate_quota_refusals", "Quota refusals of calls", ["tenant", "reason"], registry=r
        )
        self.caps = Counter(
            "fairgate_anomaly_caps", "Calls the guard stopped at their cap", ["tenant"], registry=r
        )
        self.conservative = Counter(
            "fairgate_conservative_calls",
            "Calls ordered by their p90: the tenant's predictions of that kind went wrong",
            ["tenant"],
            registry=r,
        )
        self.overload_level = Gauge(
            "fairgate_overload_level",
            "0 normal, 1 sheddable work held, 2 batch shrunk, 3 new jobs refused",
            registry=r,
        )
        self.overload_changes = Counter(
            "fairgate_overload_changes", "Overload level changes, by the level reached", ["level"],
            registry=r,
        )  # fmt: skip
        self.shed_jobs = Counter(
            "fairgate_shed_jobs", "New jobs refused under overload (SLO_SHED)", ["tenant"],
            registry=r,
        )  # fmt: skip

        self.share_waits = Counter(
            "fairgate_share_waits",
            "Calls the pool's fair share across replicas made wait: their tenant led the"
            " least-served waiting tenant by more than the slack",
            ["tenant"],
            registry=r,
        )
        self.share_failures = Counter(
            "fairgate_share_unreachable",
            "Exchanges with the pool's fair share (Redis) that failed: no call is sent meanwhile",
            registry=r,
        )
        self.yields = Counter(
            "fairgate_calls_yielded",
            "Running calls aborted to give their slot to another job's waiting call (they run"
            " again): sheddable calls, and with share_slots those of a tenant over its share",
            ["tenant"],
            registry=r,
        )

    def forget_tenant(self, tenant_id: str) -> None:
        """A deleted tenant's series go, and its label with them: a gateway that outlives its
        first `max_tenants` tenants keeps naming its new ones. Its calls cancelled with it end
        later: they count as `_other`, not as its series back (for good, its place taken)."""
        self._tenants.discard(tenant_id)
        self._gone[tenant_id] = None
        if len(self._gone) > self.max_tenants:
            self._gone.popitem(last=False)
        self.recent.forget(tenant_id)
        for metric in vars(self).values():
            if isinstance(metric, Counter | Gauge | Histogram):
                with contextlib.suppress(ValueError):  # a metric without a tenant label
                    metric.remove_by_labels({"tenant": tenant_id})

    def admitted(self, tenant_id: str) -> None:
        """The tenant has a new job: a tenant of a deleted one's id is named again."""
        self._gone.pop(tenant_id, None)

    def tenant(self, tenant_id: str) -> str:
        """The label value for a tenant (bounded)."""
        if tenant_id in self._gone:
            return OTHER
        if tenant_id in self._tenants:
            return tenant_id
        if len(self._tenants) < self.max_tenants:
            self._tenants.add(tenant_id)
            return tenant_id
        return OTHER

    def call_ended(
        self,
        tenant_id: str,
        node: NodeRun,
        produced: int,
        times: CallTimes,
        conservative: bool = False,
        model: str = "",
        settled: int | None = None,
    ) -> None:
        """`settled`: the output tokens its quota settled (None: released)."""
        if self.genai is not None:
            self.genai.call_ended(node, produced, model, times)
        if tenant_id not in self._gone:
            self.recent.call_ended(tenant_id, node, produced)
        tenant = self.tenant(tenant_id)
        self.calls.labels(tenant, node.state.value).inc()
        if conservative:
            self.conservative.labels(tenant).inc()
        if settled is not None:
            self.input_tokens.labels(tenant).inc(node.prompt_tokens)
            self.output_tokens.labels(tenant).inc(settled)
        if node.state is NodeState.CAPPED:
            self.caps.labels(tenant).inc()
        for histogram, seconds in (
            (self.queue_wait, times.queue_wait),
            (self.ttft, times.ttft),
            (self.tpot, times.tpot),
        ):
            if seconds is not None:
                histogram.labels(tenant).observe(seconds)

    def job_ended(self, run: JobRun) -> None:
        self.jobs.labels(self.tenant(run.tenant_id), run.state.value).inc()

    def overload(self, level: int) -> None:
        self.overload_level.set(level)
        self.overload_changes.labels(str(level)).inc()

    def shed(self, tenant_id: str) -> None:
        self.shed_jobs.labels(self.tenant(tenant_id)).inc()

    def yielded(self, tenant_id: str) -> None:
        self.yields.labels(self.tenant(tenant_id)).inc()

    def share_waited(self, tenant_id: str) -> None:
        self.share_waits.labels(self.tenant(tenant_id)).inc()

    def share_unreachable(self) -> None:
        self.share_failures.inc()

    def refused(self, tenant_id: str, reason: str) -> None:
        self.refusals.labels(self.tenant(tenant_id), reason).inc()

    def watch(self, dispatcher: Dispatcher) -> None:
        """Report the dispatcher's and its backends' gauges at each scrape."""
        self._dispatch = DispatchCollector(dispatcher, self)

    async def exposition(self, accept: str, accept_encoding: str) -> tuple[bytes, dict[str, str]]:
        """The scrape's body and headers for its `Accept` and `Accept-Encoding` headers: the
        dispatcher's gauges read here, on its event loop (its state is not for other threads),
        the text written, and gzipped when the scraper takes it (Prometheus does), in a worker
        thread (the registry's metrics lock their own values)."""
        encode, content_type = choose_encoder(accept)
        gauges = [] if self._dispatch is None else list(self._dispatch.collect())
        joined = _Joined(self.registry, gauges)
        headers = {"Content-Type": content_type}
        if not gzip_accepted(accept_encoding):
            return await anyio.to_thread.run_sync(encode, joined), headers

        def write() -> bytes:
            return gzip.compress(encode(joined), compresslevel=_GZIP_LEVEL)

        headers["Content-Encoding"] = "gzip"
        return await anyio.to_thread.run_sync(write), headers


class _Joined(Collector):
    """The registry's metrics, then gauges already read."""

    def __init__(self, registry: CollectorRegistry, gauges: list[Metric]) -> None:
        self.registry, self.gauges = registry, gauges

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        yield from self.gauges


class DispatchCollector(Collector):
    def __init__(self, dispatcher: Dispatcher, metrics: GatewayMetrics) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        dispatcher = self.dispatcher
        yield GaugeMetricFamily(
            "fairgate_ready_calls", "Calls ready for a backend", value=dispatcher.ready_calls()
        )
        active = GaugeMetricFamily("fairgate_active_jobs", "Jobs not ended", labels=["tenant"])
        tenants = Tally(self.metrics.tenant(r.tenant_id) for r in dispatcher.runs.values())
        for tenant, count in tenants.items():
            active.add_metric([tenant], count)
        yield active
        yield CounterMetricFamily(
            "fairgate_redis_round_trips",
            "Requests this process sent to Redis (a pipeline counts once)",
            value=round_trips(),
        )
        gauges = {
            "kv_usage_ratio": GaugeMetricFamily(
                "fairgate_backend_kv_usage_ratio", "KV blocks in use", labels=["backend"]
            ),
            "running": GaugeMetricFamily(
                "fairgate_backend_running_calls", "Calls in the batch", labels=["backend"]
            ),
            "waiting": GaugeMetricFamily(
                "fairgate_backend_waiting_calls", "Calls not admitted yet", labels=["backend"]
            ),
            "healthy": GaugeMetricFamily(
                "fairgate_backend_healthy", "1 while the backend takes calls", labels=["backend"]
            ),
        }
        for name, cap in dispatcher.capacities().items():
            if cap.kv_usage is not None:
                gauges["kv_usage_ratio"].add_metric([name], cap.kv_usage)
            gauges["running"].add_metric([name], cap.running)
            gauges["waiting"].add_metric([name], cap.waiting)
            gauges["healthy"].add_metric([name], float(cap.healthy))
        yield from gauges.values()
