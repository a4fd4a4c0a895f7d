"""A real gateway on port 0 over the simulated engine, a small real tokenizer and a real store.

The gateway, SDK (tests/fairgate) and CLI tests share it: the SDK tests import these fixtures.
The journal tests share two replicas' journals on the local Redis (`journals`).
Tenants: `alpha` (weight 2), `beta` (one queued job at most). The simulated engine's tokens are
a hash of the call and position, never end-of-sequence: every call makes exactly max_tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import anyio
import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from transformers import PreTrainedTokenizerFast

from engine import LLMEngine
from fairgate.v1 import gateway_pb2_grpc
from gateway.journal import RedisJournal
from gateway.server import RunningGateway, running_gateway
from gateway.settings import Settings
from gateway.telemetry import setup_tracing
from tenants import MemoryQuotaStore, TenantQuota
from tests.conftest import REDIS_URL
from tests.engine.byte_tokenizer import byte_tokenizer as engine_tokenizer
from tests.engine.simulated import sim_core as simulated_core

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ADMIN_KEY = "fg_admin_test"


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """The engine tests' byte-level BPE tokenizer, with a chat template."""
    tokenizer = engine_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def sim_core(
    step_s: float = 0.0, num_blocks: int = 4096, hidden_size: int = 0, max_num_seqs: int = 128
) -> LLMEngine:
    tokenizer = byte_tokenizer()
    return simulated_core(
        step_s, num_blocks, hidden_size, tokenizer=tokenizer, max_num_seqs=max_num_seqs
    )


@pytest.fixture
async def journals(redis_prefix: str) -> AsyncIterator[tuple[RedisJournal, RedisJournal]]:
    """Two replicas' journals on the local Redis, under the test's own key prefix."""
    one = RedisJournal(REDIS_URL, "one", lease_ttl_s=60.0, prefix=redis_prefix)
    two = RedisJournal(REDIS_URL, "two", lease_ttl_s=60.0, prefix=redis_prefix)
    yield one, two
    await one.aclose()
    await two.aclose()


@dataclass
class Harness:
    gateway: RunningGateway
    channel: grpc.aio.Channel
    stub: gateway_pb2_grpc.GatewayStub
    keys: dict[str, str]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.gateway.port}"

    def auth(self, tenant: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {self.keys[tenant]}"),)


@pytest.fixture
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """The gateway traces into `spans` when the test asks for that fixture too."""
    marker = request.node.get_closest_marker("engine_step_s")
    step_s = marker.args[0] if marker else 0.0
    tracing = request.getfixturevalue("spans") if "spans" in request.fixturenames else None
    settings = Settings(port=0, admin_key=ADMIN_KEY, policy="justitia", max_model_len=4096)
    store = MemoryQuotaStore()
    quotas = {
        "alpha": TenantQuota(weight=2.0, max_tokens_ceiling=2048),
        "beta": TenantQuota(max_queued_jobs=1, max_tokens_ceiling=2048),
    }
    keys = {}
    for tenant, quota in quotas.items():
        await store.create_tenant(tenant, tenant.title(), quota)
        keys[tenant] = (await store.issue_key(tenant))[1]
    async with (
        running_gateway(
            settings,
            core=sim_core(step_s),
            store=store,
            tracer_provider=tracing.provider if tracing is not None else None,
        ) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        yield Harness(gateway, channel, gateway_pb2_grpc.GatewayStub(channel), keys)


class SpanEnds(SpanProcessor):
    """Wakes the tasks waiting for the next span to end (on whichever thread it ends)."""

    def __init__(self) -> None:
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def next(self) -> asyncio.Event:
        event = asyncio.Event()
        self._waiting.append((asyncio.get_running_loop(), event))
        return event

    def on_end(self, span: ReadableSpan) -> None:
        waiting, self._waiting = self._waiting, []
        for loop, event in waiting:
            loop.call_soon_threadsafe(event.set)


@dataclass
class Spans:
    provider: TracerProvider
    exporter: InMemorySpanExporter
    ends: SpanEnds

    def finished(self) -> tuple[ReadableSpan, ...]:
        self.provider.force_flush()
        return self.exporter.get_finished_spans()

    async def until(
        self, check: Callable[[tuple[ReadableSpan, ...]], bool], timeout_s: float = 5.0
    ) -> tuple[ReadableSpan, ...]:
        """The finished spans, once `check` holds for them: looked at as each span ends."""
        with anyio.fail_after(timeout_s):
            while True:
                ended = self.ends.next()  # before the look: an end meanwhile is not missed
                finished = self.finished()
                if check(finished):
                    return finished
                await ended.wait()


@pytest.fixture
def spans() -> Iterator[Spans]:
    """A tracer provider recording in memory, for the harness's gateway."""
    exporter = InMemorySpanExporter()
    provider = setup_tracing(exporter)
    assert provider is not None
    ends = SpanEnds()
    provider.add_span_processor(ends)
    yield Spans(provider, exporter, ends)
    provider.shutdown()
