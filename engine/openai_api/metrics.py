"""Prometheus metrics under vLLM's names, so a gateway reads a fairgate engine as it reads vLLM.

Gauges are read at scrape time from the engine's capacity snapshot (taken between steps, so a
scrape never sees a step half-applied); counters are advanced by the completion handler as tokens
arrive: a request's prompt when its first token comes (its prefill is done), then each generated
token. Labels as vLLM sets them: `model_name` and `engine` (one engine per server: "0"), and
`vllm:cache_config_info` carries the pool's shape in its labels with the value 1. One series is
fairgate's own: `fairgate:engine_steps_total`, the steps the engine has run, read at scrape time
(a clock in engine steps for benchmarks of gateways before it, which a shared machine slows less
than seconds).
Invariant: each server has its own registry, so two servers in one process never share a series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from engine.async_engine import AsyncEngine

LABELS = ("model_name", "engine")
ENGINE_INDEX = "0"


class _Steps(Collector):
    def __init__(self, engine: AsyncEngine, labels: tuple[str, str]) -> None:
        self._engine = engine
        self._labels = list(labels)

    def collect(self) -> Iterator[Metric]:
        steps = CounterMetricFamily("fairgate:engine_steps", "Engine steps run.", labels=LABELS)
        steps.add_metric(self._labels, self._engine.steps)
        yield steps


class EngineMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: AsyncEngine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = (model_name, ENGINE_INDEX)
        blocks = engine.core.block_manager
        gauges = {
            "vllm:num_requests_running": (
                "Number of requests in model execution batches.",
                lambda: engine.capacity.num_running,
            ),
            "vllm:num_requests_waiting": (
                "Number of requests waiting to be processed.",
                lambda: engine.capacity.num_waiting,
            ),
            "vllm:kv_cache_usage_perc": (
                "KV-cache usage. 1 means 100 percent usage.",
                lambda: engine.capacity.used_blocks / blocks.num_blocks,
            ),
        }
        for name, (doc, read) in gauges.items():
            Gauge(name, doc, LABELS, registry=self.registry).labels(*labels).set_function(read)
        config = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"),
            registry=self.registry,
        )
        config.labels(
            str(blocks.block_size),
            str(blocks.num_blocks),
            str(blocks.enable_prefix_cache),
            ENGINE_INDEX,
        ).set(1)
        self.registry.register(_Steps(engine, labels))
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            LABELS,
            registry=self.registry,
        ).labels(*labels)
        self._generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            LABELS,
            registry=self.registry,
        ).labels(*labels)

    def prefilled(self, num_prompt_tokens: int) -> None:
        self._prompt_tokens.inc(num_prompt_tokens)

    def generated(self, num_tokens: int) -> None:
        self._generation_tokens.inc(num_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
