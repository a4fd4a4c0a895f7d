"""Lone calls on an idle server: time to first token direct and through fairgate, paired.

Each of `count` calls of the workload (their prompts, `LONE_MAX_TOKENS` tokens each) is sent
once straight to the server and once through a fresh gateway (`Client.generate`, whose prompt
the gateway encodes into the same ids), one call at a time, the two paths taking turns at going
first so that neither always meets a server just woken by the other. A TTFT is from the client
sending the request to its first token arriving. The gateway traces into memory meanwhile: each
call's `chat` span gives the server's part of its TTFT (`gen_ai.response.time_to_first_chunk`,
from its dispatch to the first chunk). One unmeasured call each way warms both paths.
Invariant: nothing else runs on the server meanwhile, so the gateway's calls' spans, in the
order they started, are its lone calls'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import anyio
import httpx
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.backends.direct import send_one
from bench.backends.records import LoneCall
from bench.backends.through_gateway import open_gateway
from bench.backends.workload import PlannedCall, Workload
from fairgate import Client
from fairgate.results import TextDelta
from gateway.settings import Settings

LONE_MAX_TOKENS = 8
LONE_TIMEOUT_S = 60.0  # a lone call still going after this long is stuck
FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"


def lone_calls(workload: Workload, count: int) -> list[tuple[str, PlannedCall]]:
    """(tenant, call) of the workload's first `count` calls, each cut to LONE_MAX_TOKENS."""
    calls = [
        (p.job.tenant, dataclasses.replace(c, max_tokens=min(c.max_tokens, LONE_MAX_TOKENS)))
        for p in workload.jobs
        for c in p.calls
    ]
    return calls[:count]


async def _direct_ttft(http: httpx.AsyncClient, model: str, call: PlannedCall, label: str) -> float:
    with anyio.fail_after(LONE_TIMEOUT_S):
        record = await send_one(http, model, call, label)
    assert record.first_token is not None
    return record.first_token - record.sent


async def _gateway_ttft(client: Client, call: PlannedCall) -> float:
    sent = anyio.current_time()
    first = None
    with anyio.fail_after(LONE_TIMEOUT_S):
        async for item in client.generate(call.text, max_tokens=call.max_tokens):
            if first is None and isinstance(item, TextDelta) and item.token_ids:
                first = anyio.current_time()
    if first is None:
        raise RuntimeError("a lone call through the gateway streamed no token")
    return first - sent


async def ttft_pairs(
    http: httpx.AsyncClient, model: str, settings: Settings, workload: Workload, count: int
) -> list[LoneCall]:
    """Each lone call's TTFTs: direct, through fairgate, and the server's part of the latter."""
    calls = lone_calls(workload, count + 1)
    pairs = []
    spans = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    async with open_gateway(settings, workload.tenants, workload.ceiling, tracing) as gateway:
        clients = {t: Client(gateway.target, key) for t, key in gateway.keys.items()}
        try:
            for i, (tenant, call) in enumerate(calls):
                if i % 2:
                    fairgate = await _gateway_ttft(clients[tenant], call)
                    direct = await _direct_ttft(http, model, call, f"lone-{i}")
                else:
                    direct = await _direct_ttft(http, model, call, f"lone-{i}")
                    fairgate = await _gateway_ttft(clients[tenant], call)
                pairs.append((direct, fairgate))
        finally:
            for client in clients.values():
                await client.aclose()
    tracing.shutdown()
    server = _first_chunks(spans.get_finished_spans())
    if len(server) != len(pairs):
        raise RuntimeError(f"{len(pairs)} lone calls through the gateway, {len(server)} spans")
    # the first pair warms both paths
    return [LoneCall(d, f, s) for (d, f), s in zip(pairs, server, strict=True)][1:]


def _first_chunks(spans: Sequence[ReadableSpan]) -> list[float]:
    """Each call span's time from dispatch to first chunk, in the order the calls started."""
    firsts = []
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        value = (span.attributes or {}).get(FIRST_CHUNK)
        if isinstance(value, int | float):
            firsts.append(float(value))
    return firsts
