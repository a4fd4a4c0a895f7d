"""The client SDK against the real gateway: typed streams, and errors with their details.

The server is the gateway harness of tests/gateway/conftest.py: grpc.aio on port 0, the
simulated engine (every call makes exactly max_tokens tokens), the in-memory quota store.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager

import anyio
import grpc
import pytest

from fairgate import (
    Client,
    DeadlineExceeded,
    FinishReason,
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
from tenants import TenantQuota
from tenants.models import BUSY_RETRY_S
from tests.gateway.conftest import Harness

pytestmark = pytest.mark.anyio
TOO_LONG = "zq xv " * 4000  # far more tokens than the model's context of 4096


def client(h: Harness, tenant: str = "alpha") -> Client:
    return Client(h.target, h.keys[tenant])


async def collect(events: AsyncIterator[JobEvent]) -> list[JobEvent]:
    return [event async for event in events]


async def test_run_job_streams_typed_events_of_a_map_reduce(harness: Harness) -> None:
    documents = {f"doc{i}": f"fact number {i}" for i in range(10)}
    async with client(harness) as alpha:
        spec = map_reduce(documents, max_tokens=4, reduce_max_tokens=6)
        events = await collect(alpha.run_job(spec))
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert isinstance(events[-1], JobFinished)
    job = events[-1].job
    assert job.state is JobState.SUCCEEDED and job.tenant_id == "alpha"
    assert len(job.nodes) == 11
    assert all(job.node(f"map_{doc}").output_tokens == 4 for doc in documents)
    assert job.node("reduce").output_tokens == 6
    streamed: dict[str, str] = {}
    counted: dict[str, int] = {}
    for event in events:
        if isinstance(event, TokenDelta):
            streamed[event.node_id] = streamed.get(event.node_id, "") + event.text
            counted[event.node_id] = counted.get(event.node_id, 0) + event.token_count
    assert streamed == job.outputs
    assert counted == {node.id: node.output_tokens for node in job.nodes}
    changes = [e for e in events if isinstance(e, NodeStateChanged) and e.node.id == "reduce"]
    assert [c.node.state for c in changes] == [
        NodeState.READY,
        NodeState.RUNNING,
        NodeState.SUCCEEDED,
    ]
    assert changes[0].previous_state is NodeState.PENDING
    assert job.usage.output_tokens == sum(n.output_tokens for n in job.nodes) == 46


async def test_submit_get_watch_from_a_sequence_and_idempotency(harness: Harness) -> None:
    spec = JobBuilder("twice", idempotency_key="once").node("a", prompt="hi", max_tokens=3).build()
    async with client(harness) as alpha:
        first = await alpha.submit_job(spec)
        again = await alpha.submit_job(spec)
        assert again.job_id == first.job_id
        everything = await collect(alpha.watch_job(first.job_id))
        resumed = await collect(alpha.watch_job(first.job_id, from_sequence=3))
        fetched = await alpha.get_job(first.job_id)
    # the job ended, its token deltas were dropped: every other event from 3 on is retained
    retained = [e for e in everything[2:] if not isinstance(e, TokenDelta)]
    assert resumed == retained and retained[-1] == everything[-1]
    assert fetched.state is JobState.SUCCEEDED
    final = everything[-1]
    assert isinstance(final, JobFinished) and final.job.node("a").output == fetched.node("a").output
    assert fetched.node("a").output_tokens == 3
    assert fetched.create_time is not None
    assert abs(fetched.create_time.timestamp() - time.time()) < 60


@pytest.mark.engine_step_s(0.002)
async def test_cancel_ends_a_watched_job(harness: Harness) -> None:
    spec = (
        JobBuilder("hold")
        .node("a", prompt="x", max_tokens=1500)
        .node("b", prompt="{{a.output}}", depends_on=["a"])
        .build()
    )
    async with client(harness) as alpha:
        job = await alpha.submit_job(spec)
        assert job.state is JobState.RUNNING
        seen: list[JobEvent] = []

        async def watch() -> None:
            seen.extend(await collect(alpha.watch_job(job.job_id)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            cancelled = await alpha.cancel_job(job.job_id)
        assert cancelled.state is JobState.CANCELLED
    assert isinstance(seen[-1], JobFinished) and seen[-1].job.state is JobState.CANCELLED
    assert {n.state for n in seen[-1].job.nodes} == {NodeState.CANCELLED}


async def test_a_failed_node_fails_its_dependents(harness: Harness) -> None:
    spec = (
        JobBuilder(inputs={"text": TOO_LONG})
        .node("bad", prompt="{{inputs.text}}", max_tokens=4)
        .node("after", prompt="{{bad.output}}", depends_on=["bad"], max_tokens=4)
        .node("free", prompt="independent", max_tokens=4)
        .build()
    )
    async with client(harness) as alpha:
        events = await collect(alpha.run_job(spec))
    assert isinstance(events[-1], JobFinished)
    job = events[-1].job
    assert job.state is JobState.FAILED
    assert job.node("bad").state is NodeState.FAILED and "exceeds" in job.node("bad").reason
    assert job.node("after").state is NodeState.FAILED and "bad" in job.node("after").reason
    assert job.node("free").state is NodeState.SUCCEEDED


async def test_generate_streams_deltas_then_the_whole_text(harness: Harness) -> None:
    async with client(harness) as alpha:
        items = [item async for item in alpha.generate("one two three", max_tokens=8)]
    *deltas, final = items
    assert deltas and all(isinstance(d, TextDelta) for d in deltas)
    assert isinstance(final, GenerateFinished)
    assert final.text == "".join(d.text for d in deltas if isinstance(d, TextDelta))
    assert sum(len(d.token_ids) for d in deltas if isinstance(d, TextDelta)) == 8
    assert final.usage.output_tokens == 8 and final.usage.prompt_tokens > 3


async def test_calls_name_their_model(harness: Harness) -> None:
    served = "SmolLM2-135M-Instruct"  # the harness's one model
    job = JobBuilder().node("a", prompt="hi", max_tokens=2, model=served).build()
    async with client(harness) as alpha:
        finished = (await collect(alpha.run_job(job)))[-1]
        assert isinstance(finished, JobFinished) and finished.job.state is JobState.SUCCEEDED
        with pytest.raises(InvalidArgument, match="unknown model 'elsewhere'"):
            [item async for item in alpha.generate("hi", max_tokens=2, model="elsewhere")]


async def test_invalid_job_names_each_offending_field(harness: Harness) -> None:
    spec = (
        JobBuilder()
        .node("a", prompt="{{inputs.missing}}", depends_on=["b"])
        .node("b", prompt="y", depends_on=["a"], max_tokens=0)
        .build()
    )
    async with client(harness) as alpha:
        with pytest.raises(InvalidArgument) as caught:
            await alpha.submit_job(spec)
    fields = {v.field for v in caught.value.field_violations}
    assert {"nodes[0].prompt_template", "nodes[1].sampling.max_tokens"} <= fields
    assert any(f.startswith("nodes[") and ".depends_on[" in f for f in fields)


async def test_quota_refusal_carries_retry_info(harness: Harness) -> None:
    slow = JobBuilder().node("a", prompt="one", max_tokens=2000).build()
    async with client(harness, "beta") as beta:  # beta may have one job queued at a time
        await beta.submit_job(slow)
        with pytest.raises(QuotaExceeded) as caught:
            await beta.submit_job(slow)
    refusal = caught.value
    assert refusal.retry_after_s == pytest.approx(BUSY_RETRY_S)
    assert [q.subject for q in refusal.quota_violations] == ["tenant:beta"]
    assert refusal.error_info is not None
    assert refusal.error_info.reason == "QUOTA_QUEUED_JOBS"
    assert refusal.error_info.metadata["allowed"] == "1"


async def test_a_generate_its_quota_refuses_says_why(harness: Harness) -> None:
    """The call is admitted, then its reservation is refused by the daily budget: the stream
    ends with finish_reason ERROR and the refusal's reason, not a bare ERROR."""
    store = harness.gateway.store
    await store.create_tenant("frugal", "Frugal", TenantQuota(daily_token_budget=50))
    key = (await store.issue_key("frugal"))[1]
    async with Client(harness.target, key) as frugal:
        items = [item async for item in frugal.generate("hello", max_tokens=100)]
    assert isinstance(items[-1], GenerateFinished)
    assert items[-1].finish_reason is FinishReason.ERROR
    assert items[-1].reason.startswith("daily budget of 50 tokens")


async def test_a_generate_closed_early_cancels_its_call_and_charges_what_it_made(
    harness: Harness,
) -> None:
    async with client(harness) as alpha, aclosing(alpha.generate("go", max_tokens=2000)) as items:
        async for _ in items:
            break
    store, dispatcher = harness.gateway.store, harness.gateway.dispatcher
    with anyio.fail_after(5):  # the call is aborted, its quota settled, its job finished
        await dispatcher.wait_calls_closed()
    u = await store.usage("alpha")
    assert (u.active_reservations, u.queued_jobs) == (0, 0), u
    assert not dispatcher.streams and u.settled_calls == 1
    # the tokens made before the client left, not the 2,000 it asked for
    assert 1 <= u.output_tokens < 2000
    assert u.tokens_today == u.input_tokens + u.output_tokens


async def test_other_tenants_jobs_are_not_found(harness: Harness) -> None:
    async with client(harness) as alpha:
        job = await alpha.submit_job(JobBuilder().node("a", prompt="secret").build())
    async with client(harness, "beta") as beta:
        with pytest.raises(NotFound):
            await beta.get_job(job.job_id)
        with pytest.raises(NotFound):
            await beta.cancel_job(job.job_id)
        with pytest.raises(NotFound):
            await collect(beta.watch_job(job.job_id))
    assert re.fullmatch(r"job-[0-9a-f]{16}", job.job_id)


async def test_bad_key_is_unauthenticated(harness: Harness) -> None:
    async with Client(harness.target, "fg_0123456789abcdef_" + "x" * 43) as stranger:
        with pytest.raises(Unauthenticated):
            await stranger.get_job("job-1")


async def test_no_server_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with Client(f"127.0.0.1:{port}", "key", timeout_s=5.0) as nobody:
        with pytest.raises(Unavailable):
            await nobody.get_job("job-1")


GetJob = Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]


@asynccontextmanager
async def answering_get_job(get_job: GetJob) -> AsyncIterator[str]:
    """A server (not the gateway) whose GetJob is `get_job`; yields its target."""
    handler = grpc.method_handlers_generic_handler(
        "fairgate.v1.Gateway", {"GetJob": grpc.unary_unary_rpc_method_handler(get_job)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def test_a_call_past_its_timeout_is_deadline_exceeded_not_a_bare_error() -> None:
    """A unary call on a connection gone silent meets its `timeout_s` before the keepalive gives
    the connection up: it raised the base FairgateError, which no `except` of a kind caught."""
    never = anyio.Event()

    async def get_job(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        await never.wait()
        return b""

    async with answering_get_job(get_job) as target:
        try:
            async with Client(target, "key", timeout_s=0.2) as client:
                with pytest.raises(DeadlineExceeded):
                    await client.get_job("job-1")
        finally:
            never.set()


async def test_details_that_do_not_parse_still_raise_the_status() -> None:
    """A proxy's or a foreign server's `grpc-status-details-bin` that is no Status escaped as
    protobuf's DecodeError, past every `except Unavailable` and `except FairgateError`."""

    async def get_job(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        context.set_trailing_metadata((("grpc-status-details-bin", b"\xff\xff\xff"),))
        await context.abort(grpc.StatusCode.UNAVAILABLE, "upstream connect error")

    async with answering_get_job(get_job) as target, Client(target, "key", timeout_s=5.0) as client:
        with pytest.raises(Unavailable, match="upstream connect error"):
            await client.get_job("job-1")
