"""The client SDK against a real grpc.aio server: typed streams, and errors with their details.

The server is the echo gateway (tests/echo_gateway.py): the real job model, validation, quota
store, auth interceptor and error edge, with calls that answer their rendered prompt.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import anyio
import pytest

from fairgate import (
    Client,
    GenerateFinished,
    InvalidArgument,
    JobBuilder,
    JobEvent,
    JobFinished,
    JobState,
    NodeState,
    NodeStateChanged,
    NotFound,
    QuotaExceeded,
    TextDelta,
    TokenDelta,
    Unauthenticated,
    Unavailable,
    map_reduce,
)
from fairgate.v1 import gateway_pb2_grpc
from tenants import MemoryQuotaStore, TenantQuota
from tests.echo_gateway import EchoGateway
from tests.serving import serving

pytestmark = pytest.mark.anyio
NOW = 1_750_000_000.0  # the store's clock stands still: no bucket refill during a test
RATE = 100  # acme's tokens per minute


@dataclass
class Env:
    target: str
    store: MemoryQuotaStore
    acme_key: str
    globex_key: str

    def client(self, key: str | None = None) -> Client:
        return Client(self.target, self.acme_key if key is None else key)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    store = MemoryQuotaStore(clock=lambda: NOW)
    await store.create_tenant("acme", "Acme", TenantQuota(tokens_per_minute=RATE))
    await store.create_tenant("globex", "Globex", TenantQuota())
    _, acme_key = await store.issue_key("acme")
    _, globex_key = await store.issue_key("globex")
    service = EchoGateway(store, clock=lambda: NOW)
    async with serving(
        store, lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(service, server)
    ) as target:
        yield Env(target, store, acme_key, globex_key)


async def collect(events: AsyncIterator[JobEvent]) -> list[JobEvent]:
    return [event async for event in events]


async def test_run_job_streams_typed_events_of_a_map_reduce(env: Env) -> None:
    documents = {f"doc{i}": f"fact number {i}" for i in range(10)}
    async with env.client() as client:
        events = await collect(client.run_job(map_reduce(documents)))
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert isinstance(events[-1], JobFinished)
    job = events[-1].job
    assert job.state is JobState.SUCCEEDED and job.tenant_id == "acme"
    assert len(job.nodes) == 11
    for text in documents.values():
        assert text in job.outputs["reduce"]
    streamed: dict[str, str] = {}
    for event in events:
        if isinstance(event, TokenDelta):
            streamed[event.node_id] = streamed.get(event.node_id, "") + event.text
    assert streamed == job.outputs
    changes = [e for e in events if isinstance(e, NodeStateChanged) and e.node.id == "reduce"]
    assert [c.node.state for c in changes] == [
        NodeState.READY,
        NodeState.RUNNING,
        NodeState.SUCCEEDED,
    ]
    assert changes[0].previous_state is NodeState.PENDING
    assert job.usage.output_tokens == sum(n.output_tokens for n in job.nodes) > 0


async def test_submit_get_watch_from_a_sequence_and_idempotency(env: Env) -> None:
    spec = JobBuilder("twice", idempotency_key="once").node("a", prompt="hello there").build()
    async with env.client() as client:
        first = await client.submit_job(spec)
        again = await client.submit_job(spec)
        assert again.job_id == first.job_id
        fetched = await client.get_job(first.job_id)
        assert fetched.node("a").output == "hello there"
        assert fetched.create_time is not None and fetched.create_time.timestamp() == NOW
        everything = await collect(client.watch_job(first.job_id))
        resumed = await collect(client.watch_job(first.job_id, from_sequence=3))
    assert [e.sequence for e in resumed] == [e.sequence for e in everything][2:]
    assert resumed == everything[2:]


async def test_cancel_ends_a_watched_job(env: Env) -> None:
    spec = JobBuilder("hold").node("a", prompt="x").node("b", prompt="y", depends_on=["a"]).build()
    async with env.client() as client:
        job = await client.submit_job(spec)
        assert job.state is JobState.RUNNING
        seen: list[JobEvent] = []

        async def watch() -> None:
            seen.extend(await collect(client.watch_job(job.job_id)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            cancelled = await client.cancel_job(job.job_id)
        assert cancelled.state is JobState.CANCELLED
    assert isinstance(seen[-1], JobFinished) and seen[-1].job.state is JobState.CANCELLED
    assert {n.state for n in seen[-1].job.nodes} == {NodeState.CANCELLED}


async def test_a_failed_node_fails_its_dependents(env: Env) -> None:
    spec = (
        JobBuilder()
        .node("bad", prompt="please FAIL")
        .node("after", prompt="{{bad.output}}", depends_on=["bad"])
        .node("free", prompt="independent")
        .build()
    )
    async with env.client() as client:
        events = await collect(client.run_job(spec))
    assert isinstance(events[-1], JobFinished)
    job = events[-1].job
    assert job.state is JobState.FAILED
    assert job.node("after").state is NodeState.FAILED and "bad" in job.node("after").reason
    assert job.node("free").state is NodeState.SUCCEEDED


async def test_generate_streams_deltas_then_the_whole_text(env: Env) -> None:
    async with env.client() as client:
        items = [item async for item in client.generate("one two three", max_tokens=8)]
    *deltas, final = items
    assert all(isinstance(d, TextDelta) for d in deltas) and len(deltas) == 3
    assert isinstance(final, GenerateFinished)
    assert final.text == "one two three"
    assert [d.text for d in deltas if isinstance(d, TextDelta)] == ["one", " two", " three"]
    assert final.usage.output_tokens == 3


async def test_invalid_job_names_each_offending_field(env: Env) -> None:
    spec = (
        JobBuilder()
        .node("a", prompt="{{inputs.missing}}", depends_on=["b"])
        .node("b", prompt="y", depends_on=["a"], max_tokens=0)
        .build()
    )
    async with env.client() as client:
        with pytest.raises(InvalidArgument) as caught:
            await client.submit_job(spec)
    fields = {v.field for v in caught.value.field_violations}
    assert {"nodes[0].prompt_template", "nodes[1].sampling.max_tokens"} <= fields
    assert any(f.startswith("nodes[") and ".depends_on[" in f for f in fields)


async def test_quota_refusal_carries_retry_info(env: Env) -> None:
    held = 80
    await env.store.reserve("acme", "held-call", held, ttl_s=60.0)
    asked = 50
    async with env.client() as client:
        with pytest.raises(QuotaExceeded) as caught:
            await collect_generate(client, asked)
        refusal = caught.value
        assert refusal.retry_after_s == pytest.approx((asked - (RATE - held)) * 60 / RATE)
        assert [q.subject for q in refusal.quota_violations] == ["tenant:acme"]
        assert refusal.error_info is not None
        assert refusal.error_info.reason == "TOKEN_RATE_EXCEEDED"
        assert refusal.error_info.metadata["allowed"] == str(RATE)
        with pytest.raises(QuotaExceeded) as too_big:
            await collect_generate(client, RATE + 1)
        assert too_big.value.retry_after_s is None  # larger than the limit: waiting cannot help


async def collect_generate(client: Client, max_tokens: int) -> None:
    async with aclosing(client.generate("hi", max_tokens=max_tokens)) as items:
        async for _ in items:
            pass


async def test_other_tenants_jobs_are_not_found(env: Env) -> None:
    async with env.client() as acme:
        job = await acme.submit_job(JobBuilder().node("a", prompt="secret").build())
    async with env.client(env.globex_key) as globex:
        with pytest.raises(NotFound):
            await globex.get_job(job.job_id)
        with pytest.raises(NotFound):
            await globex.cancel_job(job.job_id)
        with pytest.raises(NotFound):
            await collect(globex.watch_job(job.job_id))


async def test_bad_key_is_unauthenticated(env: Env) -> None:
    async with env.client("fg_0123456789abcdef_" + "x" * 43) as stranger:
        with pytest.raises(Unauthenticated):
            await stranger.get_job("job-1")


async def test_no_server_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with Client(f"127.0.0.1:{port}", "key", timeout_s=5.0) as client:
        with pytest.raises(Unavailable):
            await client.get_job("job-1")
