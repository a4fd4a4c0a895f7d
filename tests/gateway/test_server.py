"""The whole gRPC path with a real server on port 0, real clients and the simulated engine."""

from __future__ import annotations

from typing import Any

import anyio
import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.job_run import JobRun, JobState, NodeState
from gateway.jobs.model import ChatMessage, JobSpec
from gateway.jobs.template import render
from gateway.prompts import encode_prompt
from gateway.server import running_gateway
from gateway.settings import Settings
from tenants import MemoryQuotaStore, TenantQuota
from tests.engine.simulated import sim_core as engine_sim_core
from tests.gateway.conftest import ADMIN_KEY, Harness, Spans, byte_tokenizer, sim_core
from tests.gateway.jobs.factories import make_node

pytestmark = pytest.mark.anyio


def node(node_id: str, prompt: str, max_tokens: int = 8, *deps: str) -> pb.NodeSpec:
    sampling = pb.SamplingSpec(max_tokens=max_tokens)
    return pb.NodeSpec(id=node_id, prompt_template=prompt, depends_on=deps, sampling=sampling)


def map_reduce(n_maps: int = 9) -> pb.JobSpec:
    maps = [node(f"map_{i}", f"summarise {{{{inputs.doc_{i}}}}}") for i in range(n_maps)]
    body = " | ".join(f"{{{{map_{i}.output}}}}" for i in range(n_maps))
    reduce = node("reduce", f"combine: {body}", 8, *(m.id for m in maps))
    inputs = {f"doc_{i}": f"the quick brown fox number {i}" for i in range(n_maps)}
    return pb.JobSpec(name="mr", nodes=[*maps, reduce], inputs=inputs)


async def run_to_end(h: Harness, tenant: str, spec: pb.JobSpec) -> pb.Job:
    finished = None
    async for event in h.stub.RunJob(pb.SubmitJobRequest(job=spec), metadata=h.auth(tenant)):
        if event.WhichOneof("event") == "job_finished":
            finished = event.job_finished.job
    assert finished is not None
    return finished


def status_of(err: grpc.aio.AioRpcError) -> tuple[int, list[object]]:
    status = rpc_status.from_call(err)
    assert status is not None
    details: list[object] = []
    for any_detail in status.details:
        for kind in (
            error_details_pb2.BadRequest,
            error_details_pb2.RetryInfo,
            error_details_pb2.QuotaFailure,
            error_details_pb2.ErrorInfo,
        ):
            if any_detail.Is(kind.DESCRIPTOR):
                message = kind()
                any_detail.Unpack(message)
                details.append(message)
    return status.code, details


async def test_map_reduce_job_feeds_mapped_outputs_to_the_reduce_prompt(harness: Harness) -> None:
    job = await run_to_end(harness, "alpha", map_reduce(9))
    assert job.state == pb.JOB_STATE_SUCCEEDED and len(job.nodes) == 10
    nodes = {n.id: n for n in job.nodes}
    outputs = {i: nodes[i].output for i in nodes if i.startswith("map_")}
    assert all(nodes[i].output_tokens == 8 for i in outputs)
    spec = map_reduce(9).nodes[-1].prompt_template
    rendered = render(spec, {}, outputs)
    assert all(text in rendered for text in outputs.values())
    tokenizer = harness.gateway.dispatcher.encoder().tokenizer
    assert nodes["reduce"].prompt_tokens == len(encode_prompt(tokenizer, rendered))
    assert job.usage.output_tokens == 80


Auth = tuple[tuple[str, str], ...]


async def _tenants(store: MemoryQuotaStore, quota: TenantQuota | None = None) -> dict[str, Auth]:
    """Tenants alpha and beta in `store`, each with a key: their calls' metadata."""
    auth = {}
    for tenant in ("alpha", "beta"):
        await store.create_tenant(tenant, tenant.title(), quota or TenantQuota())
        auth[tenant] = (("authorization", f"Bearer {(await store.issue_key(tenant))[1]}"),)
    return auth


def _packed_nodes() -> bytes:
    """A SubmitJobRequest of half a million empty nodes in 1 MiB: a good part of a second to
    parse, refused for its node count once parsed."""
    nodes = b"\x12\x00" * (1 << 19)  # JobSpec.nodes, each empty
    return b"\x0a" + _varint(len(nodes)) + nodes  # SubmitJobRequest.job


def _dense_invalid_job() -> bytes:
    """128 nodes each depending on all of 128 others (80 KB, a millisecond to parse), refused
    for one node's temperature once converted and validated: a tenth of a second."""
    roots = [node(f"r{i}", "hi") for i in range(128)]
    ids = [r.id for r in roots]
    children = [node(f"c{i}", "hi", 8, *ids) for i in range(128)]
    children[-1].sampling.temperature = -1.0
    return pb.SubmitJobRequest(job=pb.JobSpec(nodes=[*roots, *children])).SerializeToString()


@pytest.mark.parametrize("costly", [_packed_nodes, _dense_invalid_job], ids=["parse", "validate"])
async def test_a_tenant_whose_requests_take_long_waits_and_others_go_on(costly: Any) -> None:
    """The event loop parses, converts and validates a request, every tenant's calls waiting
    meanwhile, and a refused request costs its tenant no quota. A tenant whose requests took
    more than its share is refused before the next piece of that work, with the time until its
    share has refilled; other tenants are served."""
    settings = Settings(port=0, admin_key=ADMIN_KEY, max_loop_share_per_tenant=0.002)
    store = MemoryQuotaStore()
    auth = await _tenants(store)
    request = costly()
    async with (
        running_gateway(settings, core=sim_core(), store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        submit = channel.unary_unary("/fairgate.v1.Gateway/SubmitJob")
        codes = []
        for _ in range(10):  # each one done is refused as invalid: 40 ms of the loop holds few
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await submit(request, metadata=auth["alpha"])
            codes.append(caught.value.code())
            if codes[-1] != grpc.StatusCode.INVALID_ARGUMENT:
                break
        assert codes[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED, codes
        assert "LOOP_SHARE_EXCEEDED" in str(caught.value.trailing_metadata())
        retry = [
            d for d in status_of(caught.value)[1] if isinstance(d, error_details_pb2.RetryInfo)
        ]
        assert retry and retry[0].retry_delay.ToTimedelta().total_seconds() > 0
        small = pb.SubmitJobRequest(job=pb.JobSpec(nodes=[node("a", "hello", 4)]))
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # its small ones wait too
            await stub.SubmitJob(small, metadata=auth["alpha"])
        assert "LOOP_SHARE_EXCEEDED" in str(caught.value.trailing_metadata())
        served = await stub.SubmitJob(small, metadata=auth["beta"])
        assert served.state != pb.JOB_STATE_UNSPECIFIED


BIG_REPLIES = [("grpc.max_receive_message_length", 16 << 20)]


async def test_answers_that_take_long_to_convert_are_charged_to_their_tenant() -> None:
    """A GetJob of a job of 256 nodes of 16 KiB outputs takes milliseconds of the event loop to
    convert, every tenant's calls waiting meanwhile, for a request that parses in microseconds:
    a tenant asking for it again and again took the loop. The conversions are charged to its
    share, and past it the tenant is refused; other tenants are served."""
    settings = Settings(port=0, admin_key=ADMIN_KEY, max_loop_share_per_tenant=0.002)
    store = MemoryQuotaStore()
    auth = await _tenants(store)
    async with (
        running_gateway(settings, core=sim_core(), store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}", options=BIG_REPLIES) as channel,
    ):
        # a job as one of max_tokens_ceiling 4,096 would end, without running its million tokens
        run = JobRun(
            "job-00000000000000b1",
            "alpha",
            JobSpec(tuple(make_node(f"n{i}") for i in range(256))),
            0.0,
        )
        for done in run.nodes.values():
            done.state, done.output, done.output_tokens = NodeState.SUCCEEDED, "x" * 16384, 4096
        run.state = JobState.SUCCEEDED
        gateway.jobs.add(run)
        stub = gateway_pb2_grpc.GatewayStub(channel)
        answered = 0
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            for _ in range(100):  # 40 ms of the loop holds a few
                await stub.GetJob(pb.GetJobRequest(job_id=run.job_id), metadata=auth["alpha"])
                answered += 1
        assert answered > 0, caught.value
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "LOOP_SHARE_EXCEEDED" in str(caught.value.trailing_metadata())
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetJob(pb.GetJobRequest(job_id=run.job_id), metadata=auth["beta"])
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND  # served: not its job


async def test_a_tenant_holds_at_most_its_part_of_the_rpc_slots_and_others_are_served() -> None:
    """gRPC serves `max_concurrent_rpcs` RPCs at once, whoever makes them: a tenant whose RPCs
    wait (streams, reads of another replica's job in the tenant's turn) could hold every slot,
    and every other tenant was refused by gRPC. A tenant's RPCs past `max_rpcs_per_tenant` are
    refused (`QUOTA_RPCS`), and the slots left serve the others."""
    settings = Settings(
        port=0, admin_key=ADMIN_KEY, max_concurrent_rpcs=3, max_rpcs_per_tenant=2, grace_s=0.0
    )
    store = MemoryQuotaStore()
    auth = await _tenants(store, TenantQuota(max_streams=0))
    async with (
        running_gateway(settings, core=sim_core(step_s=0.05), store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        long = pb.SubmitJobRequest(job=pb.JobSpec(nodes=[node("a", "hello", 500)]))
        job = await stub.SubmitJob(long, metadata=auth["alpha"])
        watches = []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            for _ in range(3):
                watch = stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), metadata=auth["alpha"])
                watches.append(watch)
                await watch.read()  # its first event: the stream holds its slot
        assert len(watches) == 3 and caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "QUOTA_RPCS" in str(caught.value.trailing_metadata())
        retry = [
            d for d in status_of(caught.value)[1] if isinstance(d, error_details_pb2.RetryInfo)
        ]
        assert retry and retry[0].retry_delay.ToTimedelta().total_seconds() > 0
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetJob(pb.GetJobRequest(job_id=job.job_id), metadata=auth["beta"])
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND  # served: not its job
        for watch in watches:
            watch.cancel()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


async def test_the_simulated_engine_sleeps_its_steps_off_the_event_loop() -> None:
    """`simulated_step_s` makes each step take that long on the wall clock: it slept on the
    event loop, and no RPC of any tenant was answered while a step ran (a hostile tenant's
    long calls, back to back, starved every other)."""
    settings = Settings(
        port=0, admin_key=ADMIN_KEY, simulated_engine=True, simulated_step_s=0.5, grace_s=0.0
    )
    store = MemoryQuotaStore()
    auth = await _tenants(store)
    async with (
        running_gateway(settings, store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        long = pb.SubmitJobRequest(job=pb.JobSpec(nodes=[node("a", "hello", 100)]))
        job = await stub.SubmitJob(long, metadata=auth["alpha"])
        watch = stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), metadata=auth["alpha"])
        while (await watch.read()).WhichOneof("event") != "token_delta":
            pass  # a step has just ended: the next one takes half a second
        assert gateway.engine is not None
        steps = gateway.engine.steps
        got = await stub.GetJob(pb.GetJobRequest(job_id=job.job_id), metadata=auth["alpha"])
        assert got.state == pb.JOB_STATE_RUNNING
        assert gateway.engine.steps == steps  # answered while the step ran
        watch.cancel()
        await stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id), metadata=auth["alpha"])


@pytest.mark.engine_step_s(0.002)
async def test_cancel_mid_job_frees_engine_blocks_and_charges_what_ran(harness: Harness) -> None:
    spec = pb.JobSpec(nodes=[node("a", "one", 1500), node("b", "two {{a.output}}", 1500, "a")])
    job = await harness.stub.SubmitJob(
        pb.SubmitJobRequest(job=spec), metadata=harness.auth("alpha")
    )
    watch = harness.stub.WatchJob(
        pb.WatchJobRequest(job_id=job.job_id), metadata=harness.auth("alpha")
    )
    async for event in watch:
        if event.WhichOneof("event") == "token_delta":
            break
    watch.cancel()
    cancelled = await harness.stub.CancelJob(
        pb.CancelJobRequest(job_id=job.job_id), metadata=harness.auth("alpha")
    )
    assert cancelled.state == pb.JOB_STATE_CANCELLED
    states = {n.id: n.state for n in cancelled.nodes}
    assert states == {"a": pb.NODE_STATE_CANCELLED, "b": pb.NODE_STATE_CANCELLED}
    gateway = harness.gateway
    assert gateway.engine is not None
    core = gateway.engine.core
    with anyio.fail_after(5):
        await gateway.engine.wait_idle()  # the abort, at the end of the step in flight
        await gateway.dispatcher.wait_calls_closed()  # `a`'s follower settled what it made
    assert not core.has_unfinished and not gateway.dispatcher.streams
    blocks = core.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks
    usage = await gateway.store.usage("alpha")
    assert usage.active_reservations == 0 and usage.queued_jobs == 0
    # `a` made tokens, which its client read, before the cancel: it is charged those (else
    # reading all but the last token of every call and cancelling would be free); `b` never ran
    ran = {
        n.id: n
        for n in (
            await harness.stub.GetJob(
                pb.GetJobRequest(job_id=job.job_id), metadata=harness.auth("alpha")
            )
        ).nodes
    }["a"]
    assert usage.settled_calls == 1
    assert usage.input_tokens == ran.prompt_tokens
    assert 1 <= ran.output_tokens == usage.output_tokens < 1500
    assert usage.tokens_today == usage.input_tokens + usage.output_tokens


async def test_bad_job_is_invalid_argument_with_the_offending_field(harness: Harness) -> None:
    spec = pb.JobSpec(nodes=[node("a", "x"), node("b", "{{zzz.output}}", 8, "a", "ghost")])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=harness.auth("alpha"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    code, details = status_of(caught.value)
    assert code == code_pb2.INVALID_ARGUMENT
    bad = next(d for d in details if isinstance(d, error_details_pb2.BadRequest))
    fields = {v.field for v in bad.field_violations}
    assert "nodes[1].depends_on[1]" in fields


class _KeptOpen(MemoryQuotaStore):
    """A store that stays open when the gateway closes it: the test reads what shutdown left."""

    async def aclose(self) -> None:
        pass


async def test_calls_the_gateway_cuts_short_on_shutdown_are_not_charged() -> None:
    """The tenant pays for the calls its side cancels, not for those the gateway ends."""
    settings = Settings(port=0, admin_key=ADMIN_KEY, max_model_len=4096, grace_s=0.0)
    store = _KeptOpen()
    await store.create_tenant("alpha", "Alpha", TenantQuota(max_tokens_ceiling=2048))
    key = (await store.issue_key("alpha"))[1]
    async with (
        running_gateway(settings, core=sim_core(0.002), store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        auth = (("authorization", f"Bearer {key}"),)
        spec = pb.JobSpec(nodes=[node("a", "one", 1500)])
        job = await stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=auth)
        async for event in stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), metadata=auth):
            if event.WhichOneof("event") == "token_delta":
                break
    usage = await store.usage("alpha")
    assert usage.active_reservations == 0
    assert (usage.settled_calls, usage.output_tokens, usage.tokens_today) == (0, 0, 0)


class _WatchedAdmissions(MemoryQuotaStore):
    """A store that counts the admissions it is asked for (`asked`); those of `held`, when
    given, wait until the test opens them, `all_arrived` set once `expected` have come."""

    def __init__(self, held: str | None = None, expected: int = 0) -> None:
        super().__init__()
        self.held, self.expected, self.asked, self.arrived = held, expected, 0, 0
        self.all_arrived, self.open = anyio.Event(), anyio.Event()

    async def _gate(self, tenant_id: str) -> None:
        self.asked += 1
        if tenant_id == self.held:
            self.arrived += 1
            if self.arrived == self.expected:
                self.all_arrived.set()
            await self.open.wait()

    async def admit_job(self, tenant_id: str, *args: Any, **kwargs: Any) -> bool:
        await self._gate(tenant_id)
        return await super().admit_job(tenant_id, *args, **kwargs)

    async def admit_job_and_reserve(self, tenant_id: str, *args: Any, **kwargs: Any) -> Any:
        await self._gate(tenant_id)
        return await super().admit_job_and_reserve(tenant_id, *args, **kwargs)


async def test_a_tenant_has_at_most_its_admissions_under_way_and_others_go_on() -> None:
    """Submissions past `max_admissions_per_tenant` under way are refused at once: waiting they
    would hold the server's RPC slots, which every tenant shares."""
    settings = Settings(port=0, admin_key=ADMIN_KEY, max_admissions_per_tenant=3)
    store = _WatchedAdmissions("alpha", expected=3)
    keys = await _tenants(store)
    spec = pb.JobSpec(nodes=[node("a", "hello", 4)])
    async with (
        running_gateway(settings, core=sim_core(), store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
        anyio.create_task_group() as tg,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        waiting: list[pb.Job] = []

        async def submit() -> None:
            request = pb.SubmitJobRequest(job=spec)
            waiting.append(await stub.SubmitJob(request, metadata=keys["alpha"]))

        for _ in range(3):
            tg.start_soon(submit)
        with anyio.fail_after(10):
            await store.all_arrived.wait()
        with anyio.fail_after(5), pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=keys["alpha"])
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "QUOTA_ADMISSIONS" in str(caught.value.trailing_metadata())
        other = await stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=keys["beta"])
        assert other.state != pb.JOB_STATE_UNSPECIFIED
        store.open.set()
    assert len(waiting) == 3  # the ones under way were admitted once the store answered


async def test_a_tenant_at_its_queued_jobs_is_refused_before_its_job_is_encoded() -> None:
    """The store decides, after the job is rendered and encoded: a tenant this replica already
    holds at its limit is refused before that work, which its refusals would otherwise cost."""
    settings = Settings(port=0, admin_key=ADMIN_KEY, max_model_len=4096)
    store = _WatchedAdmissions()
    await store.create_tenant(
        "alpha", "Alpha", TenantQuota(max_queued_jobs=1, max_tokens_ceiling=2048)
    )
    auth = (("authorization", f"Bearer {(await store.issue_key('alpha'))[1]}"),)
    async with (
        running_gateway(settings, core=sim_core(0.002), store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        long = pb.SubmitJobRequest(job=pb.JobSpec(nodes=[node("a", "one", 2000)]))
        held = await stub.SubmitJob(long, metadata=auth)
        big = pb.SubmitJobRequest(job=pb.JobSpec(nodes=[node("b", "word " * 6_000, 8)]))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SubmitJob(big, metadata=auth)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "QUOTA_QUEUED_JOBS" in str(caught.value.trailing_metadata())
        assert store.asked == 1  # only the first job's admission reached the store
        await stub.CancelJob(pb.CancelJobRequest(job_id=held.job_id), metadata=auth)


async def test_a_tenants_unfinished_jobs_hold_at_most_their_characters_and_others_go_on() -> None:
    """A job of a few kilobytes that repeats a large input into every node holds megabytes of
    prompt token ids while its calls wait: a tenant's unfinished jobs hold at most
    `max_queued_chars_per_tenant` characters (inputs and prompts), counted before anything is
    rendered; room frees as its jobs end, and other tenants are not held back."""
    settings = Settings(
        port=0, admin_key=ADMIN_KEY, max_model_len=4096, max_queued_chars_per_tenant=20_000
    )
    store = _WatchedAdmissions("alpha", expected=2)
    auth = await _tenants(store, TenantQuota(max_tokens_ceiling=2048))
    # 1,000 characters of input, and 8 prompts of 1,002 that repeat it: 9,016 in all
    nodes = [node(f"n{i}", f"{{{{inputs.doc}}}} {i}", 2000) for i in range(8)]
    fat = pb.SubmitJobRequest(job=pb.JobSpec(nodes=nodes, inputs={"doc": "x" * 1000}))
    huge = pb.SubmitJobRequest(job=pb.JobSpec(nodes=[node("a", "hi")], inputs={"y": "y" * 20_000}))
    async with (
        running_gateway(settings, core=sim_core(0.002), store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        admitted: list[pb.Job] = []

        async def submit() -> None:
            admitted.append(await stub.SubmitJob(fat, metadata=auth["alpha"]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(submit)
            tg.start_soon(submit)
            with anyio.fail_after(10):  # two admissions under way count as much as two jobs
                await store.all_arrived.wait()
            with anyio.fail_after(5), pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SubmitJob(fat, metadata=auth["alpha"])
            store.open.set()
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "QUOTA_QUEUED_CHARS" in str(caught.value.trailing_metadata())
        assert error_details_pb2.RetryInfo in {type(d) for d in status_of(caught.value)[1]}
        first = admitted[0]
        await stub.SubmitJob(fat, metadata=auth["beta"])  # another tenant's room is its own
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # past the limit alone: no retry
            await stub.SubmitJob(huge, metadata=auth["beta"])
        assert "QUOTA_QUEUED_CHARS" in str(caught.value.trailing_metadata())
        assert error_details_pb2.RetryInfo not in {type(d) for d in status_of(caught.value)[1]}
        cancel = pb.CancelJobRequest(job_id=first.job_id)
        await stub.CancelJob(cancel, metadata=auth["alpha"])
        watch = pb.WatchJobRequest(job_id=first.job_id)
        with anyio.fail_after(10):
            async for _ in stub.WatchJob(watch, metadata=auth["alpha"]):
                pass  # to the job's end
        again = await stub.SubmitJob(fat, metadata=auth["alpha"])
        assert again.state != pb.JOB_STATE_UNSPECIFIED


async def test_parents_outputs_in_their_childrens_prompts_count_against_the_characters() -> None:
    """Admission counts a job's prompts with its parents' outputs empty: children that each
    repeat a parent's output held megabytes counted as nothing (128 children repeating a 2 KB
    output 15 times: 3.9 MB), and a tenant's jobs gigabytes. What the outputs add is counted as
    each child is rendered, and a child that would pass the tenant's bound fails; the count
    frees as the job ends, and other tenants go on."""
    settings = Settings(
        port=0, admin_key=ADMIN_KEY, max_model_len=4096, max_queued_chars_per_tenant=20_000
    )
    store = MemoryQuotaStore()
    auth = await _tenants(store, TenantQuota(max_tokens_ceiling=2048))
    children = [node(f"c{i}", "{{root.output}}" * 5, 1, "root") for i in range(32)]
    job = pb.JobSpec(nodes=[node("root", "say", 300), *children])
    async with (
        running_gateway(settings, core=sim_core(), store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        submitted = await stub.SubmitJob(pb.SubmitJobRequest(job=job), metadata=auth["alpha"])
        watch = pb.WatchJobRequest(job_id=submitted.job_id)
        with anyio.fail_after(30):
            events = [e async for e in stub.WatchJob(watch, metadata=auth["alpha"])]
        ended = events[-1].job_finished.job
        output = next(n.output for n in ended.nodes if n.id == "root")
        assert len(output) * 5 * 32 > 20_000  # the children's prompts together pass it
        reasons = [n.reason for n in ended.nodes if n.state == pb.NODE_STATE_FAILED]
        assert reasons and all("characters; at most 20,000" in r for r in reasons), reasons
        assert gateway.dispatcher.held_chars("alpha") == 0
        served = await stub.SubmitJob(pb.SubmitJobRequest(job=job), metadata=auth["beta"])
        assert served.state != pb.JOB_STATE_UNSPECIFIED


@pytest.mark.engine_step_s(0.002)
async def test_a_watch_from_past_a_jobs_end_gets_its_end_running_or_ended(harness: Harness) -> None:
    """A watcher asking from past the job's last event (another job's sequence, say) was told
    nothing and its stream ended in silence once the job had: no JobFinished, so it could not
    tell the job's end from a cut stream. It gets the end, as every stream does."""
    auth = harness.auth("alpha")
    job = await harness.stub.SubmitJob(
        pb.SubmitJobRequest(job=pb.JobSpec(nodes=[node("a", "one", 200)])), metadata=auth
    )
    afar = pb.WatchJobRequest(job_id=job.job_id, from_sequence=10**6)
    with anyio.fail_after(10):
        while_running = [e async for e in harness.stub.WatchJob(afar, metadata=auth)]
        full = [
            e
            async for e in harness.stub.WatchJob(
                pb.WatchJobRequest(job_id=job.job_id), metadata=auth
            )
        ]
        once_ended = [e async for e in harness.stub.WatchJob(afar, metadata=auth)]
    assert full[-1].WhichOneof("event") == "job_finished"
    assert while_running == once_ended == [full[-1]]


async def test_a_node_that_succeeded_says_its_output_in_its_state_change(
    harness: Harness,
) -> None:
    """The proto says the NodeStateChanged of a node that SUCCEEDED carries its output (a
    watcher whose token deltas were dropped has it nowhere else before JobFinished): it
    carried none. Other state changes carry none."""
    request = pb.SubmitJobRequest(job=map_reduce(2))
    events = [e async for e in harness.stub.RunJob(request, metadata=harness.auth("alpha"))]
    final = {n.id: n for n in events[-1].job_finished.job.nodes}
    changes = [e.node_state_changed.node for e in events if e.HasField("node_state_changed")]
    ended = [n for n in changes if n.state == pb.NODE_STATE_SUCCEEDED]
    assert sorted(n.id for n in ended) == sorted(final)
    for node in ended:
        assert node.output and node.output == final[node.id].output
        assert node.output_tokens == final[node.id].output_tokens
    assert all(not n.output for n in changes if n.state != pb.NODE_STATE_SUCCEEDED)


async def test_a_job_past_the_node_count_is_refused_with_the_count_alone(
    harness: Harness,
) -> None:
    """A chain of 20,000 nodes (0.3 MB) is refused for its count before it is converted or its
    graph checked (which took seconds, on the event loop every tenant shares)."""
    nodes = [node("n0", "x")] + [node(f"n{i}", "x", 8, f"n{i - 1}") for i in range(1, 20_000)]
    spec = pb.JobSpec(nodes=nodes)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=harness.auth("alpha"))
    code, details = status_of(caught.value)
    assert code == code_pb2.INVALID_ARGUMENT
    bad = next(d for d in details if isinstance(d, error_details_pb2.BadRequest))
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("nodes", "20000 nodes; at most 256")
    ]


def _violations(error: grpc.aio.AioRpcError) -> list[tuple[str, str]]:
    code, details = status_of(error)
    assert code == code_pb2.INVALID_ARGUMENT
    bad = next(d for d in details if isinstance(d, error_details_pb2.BadRequest))
    return [(v.field, v.description) for v in bad.field_violations]


async def test_a_node_past_its_message_count_is_refused_with_the_count_alone(
    harness: Harness,
) -> None:
    """400,000 empty chat messages in one node (0.8 MB), or 100,000 in a Generate request, are
    refused for their count before they are converted or checked one by one (2.9 s and 1.6 s of
    the event loop every tenant shares)."""
    chat = pb.ChatPrompt(messages=[pb.ChatMessage()] * 400_000)
    spec = pb.JobSpec(nodes=[pb.NodeSpec(id="a", chat=chat)])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=harness.auth("alpha"))
    assert _violations(caught.value) == [("nodes[0].chat.messages", "400000 messages; at most 64")]
    chat = pb.ChatPrompt(messages=[pb.ChatMessage(role="user")] * 100_000)
    request = pb.GenerateRequest(chat=chat)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in harness.stub.Generate(request, metadata=harness.auth("alpha")):
            pass
    assert _violations(caught.value) == [("chat.messages", "100000 messages; at most 64")]


async def test_templates_that_render_to_nothing_are_bounded_as_written(harness: Harness) -> None:
    """Placeholders of an empty input render to nothing, so the rendered size let 2 MB of them
    through, checked at microseconds each (1.3 s); the job's templates as written and their
    placeholders are bounded too, before anything is converted."""
    bomb = "{{inputs.a}}" * 2_500
    nodes = [pb.NodeSpec(id=f"n{i}", prompt_template=bomb) for i in range(2)]
    spec = pb.JobSpec(nodes=nodes, inputs={"a": ""})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.stub.SubmitJob(pb.SubmitJobRequest(job=spec), metadata=harness.auth("alpha"))
    assert _violations(caught.value) == [("nodes", "5000 placeholders ({{) in all; at most 4096")]


async def test_quota_refusal_carries_retry_info(harness: Harness) -> None:
    slow = pb.JobSpec(nodes=[node("a", "one", 2000)])
    await harness.stub.SubmitJob(pb.SubmitJobRequest(job=slow), metadata=harness.auth("beta"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.stub.SubmitJob(pb.SubmitJobRequest(job=slow), metadata=harness.auth("beta"))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _, details = status_of(caught.value)
    kinds = {type(d) for d in details}
    assert {
        error_details_pb2.RetryInfo,
        error_details_pb2.QuotaFailure,
        error_details_pb2.ErrorInfo,
    } <= kinds
    info = next(d for d in details if isinstance(d, error_details_pb2.ErrorInfo))
    assert info.reason == "QUOTA_QUEUED_JOBS"


async def test_other_tenants_jobs_are_not_found(harness: Harness) -> None:
    job = await harness.stub.SubmitJob(
        pb.SubmitJobRequest(job=pb.JobSpec(nodes=[node("a", "x")])), metadata=harness.auth("alpha")
    )
    for call in (
        harness.stub.GetJob(pb.GetJobRequest(job_id=job.job_id), metadata=harness.auth("beta")),
        harness.stub.CancelJob(
            pb.CancelJobRequest(job_id=job.job_id), metadata=harness.auth("beta")
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    mine = await harness.stub.GetJob(
        pb.GetJobRequest(job_id=job.job_id), metadata=harness.auth("alpha")
    )
    assert mine.tenant_id == "alpha"


async def test_missing_or_wrong_key_is_unauthenticated(harness: Harness) -> None:
    request = pb.GetJobRequest(job_id="job-x")
    for metadata in ((), (("authorization", "Bearer fg_nope_nope"),)):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await harness.stub.GetJob(request, metadata=metadata)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


NOT_A_MESSAGE = b"\xff\xff\xff\xff"  # a field number of zero: no message parses from it


@pytest.mark.parametrize("method", ["GetJob", "WatchJob"])
async def test_a_request_is_parsed_only_once_its_key_passes(harness: Harness, method: str) -> None:
    """A caller without a key cannot make the gateway parse a message (up to 16 MiB of
    repeated fields, hundreds of milliseconds of the event loop): bytes that are no message
    are refused for the key first; with a good key, as what they are."""
    path = f"/fairgate.v1.Gateway/{method}"
    call = (
        harness.channel.unary_unary(path)
        if method == "GetJob"
        else harness.channel.unary_stream(path)
    )
    for metadata, code in (
        ((), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer fg_nope_nope"),), grpc.StatusCode.UNAUTHENTICATED),
        (harness.auth("alpha"), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            reply = call(NOT_A_MESSAGE, metadata=metadata)
            if method == "GetJob":
                await reply
            else:
                async for _ in reply:
                    pass
        assert caught.value.code() == code
    assert "does not parse" in (caught.value.details() or "")


async def test_idempotency_key_returns_the_same_job(harness: Harness) -> None:
    spec = pb.JobSpec(nodes=[node("a", "x")], idempotency_key="k-1")
    first = await harness.stub.SubmitJob(
        pb.SubmitJobRequest(job=spec), metadata=harness.auth("alpha")
    )
    second = await harness.stub.SubmitJob(
        pb.SubmitJobRequest(job=spec), metadata=harness.auth("alpha")
    )
    assert first.job_id == second.job_id


async def test_concurrent_submits_with_one_idempotency_key_make_one_job(harness: Harness) -> None:
    gateway = harness.gateway
    service = gateway.service
    spec = JobSpec(nodes=(make_node("a"),), idempotency_key="k-2")
    runs: list[JobRun] = []

    async def submit() -> None:
        runs.append(await service.submit("alpha", spec))

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(submit)
    assert len({run.job_id for run in runs}) == 1
    assert len(gateway.jobs) == 1


@pytest.mark.parametrize(
    ("request_", "fields"),
    [
        (pb.GenerateRequest(prompt="x", model="nope"), ["model"]),
        (pb.GenerateRequest(chat=pb.ChatPrompt()), ["chat.messages"]),
        (
            pb.GenerateRequest(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="x")])),
            ["chat.messages[0].role"],
        ),
        (pb.GenerateRequest(prompt="x", sampling=pb.SamplingSpec(top_p=2)), ["sampling.top_p"]),
        (pb.GenerateRequest(prompt="x" * 300_000), ["prompt", "prompt"]),
        (
            pb.GenerateRequest(
                chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content="x" * 300_000)])
            ),
            ["chat.messages[0].content", "chat"],
        ),
    ],
)
async def test_a_generate_is_refused_in_its_own_fields(
    harness: Harness, request_: pb.GenerateRequest, fields: list[str]
) -> None:
    """Generate runs a one-node job: its violations named that job's paths (`nodes[0].model`,
    `inputs["prompt"]`), which the request has none of."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in harness.stub.Generate(request_, metadata=harness.auth("alpha")):
            pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in _violations(caught.value)] == fields


async def test_generate_streams_text_then_usage(harness: Harness) -> None:
    request = pb.GenerateRequest(prompt="say {{hi}}", sampling=pb.SamplingSpec(max_tokens=12))
    responses = [r async for r in harness.stub.Generate(request, metadata=harness.auth("alpha"))]
    assert sum(len(r.token_ids) for r in responses) == 12
    assert responses[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert responses[-1].usage.output_tokens == 12
    tokenizer = harness.gateway.dispatcher.encoder().tokenizer
    prompt_ids = encode_prompt(tokenizer, (ChatMessage("user", "say {{hi}}"),))
    assert responses[-1].usage.prompt_tokens == len(prompt_ids)


async def test_an_id_no_job_can_have_is_not_found_before_any_lookup(harness: Harness) -> None:
    """A 10,000-character id was quoted back in full: the reply's metadata overflowed, and the
    caller got RESOURCE_EXHAUSTED instead of NOT_FOUND."""
    for job_id in ("x" * 10_000, "job-0123456789abcdef:log", "job-0123456789ABCDEF", ""):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await harness.stub.GetJob(
                pb.GetJobRequest(job_id=job_id), metadata=harness.auth("alpha")
            )
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "16 hex digits" in (caught.value.details() or "")


async def test_a_generate_past_the_delta_budget_streams_every_token() -> None:
    """A one-node job's deltas pass `MAX_DELTA_BYTES` (1 MiB, about 4,800 tokens) as its node
    ends: they were dropped then, the call's last tokens with them, before its stream had
    read them, and Generate, whose text is its deltas, ended short of the usage it reported."""
    settings = Settings(port=0, admin_key=ADMIN_KEY, max_model_len=16384)
    store = MemoryQuotaStore()
    auth = await _tenants(store, TenantQuota(max_tokens_ceiling=8192))
    core = engine_sim_core(max_model_len=16384, tokenizer=byte_tokenizer())
    async with (
        running_gateway(settings, core=core, store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = pb.GenerateRequest(prompt="go", sampling=pb.SamplingSpec(max_tokens=6000))
        responses = [r async for r in stub.Generate(request, metadata=auth["alpha"])]
    assert responses[-1].usage.output_tokens == 6000
    assert sum(len(r.token_ids) for r in responses) == 6000


async def test_a_one_token_generate_is_one_response(harness: Harness) -> None:
    request = pb.GenerateRequest(prompt="ping", sampling=pb.SamplingSpec(max_tokens=1))
    responses = [r async for r in harness.stub.Generate(request, metadata=harness.auth("alpha"))]
    assert len(responses) == 1
    assert len(responses[0].token_ids) == 1
    assert responses[0].finish_reason == pb.FINISH_REASON_LENGTH
    assert responses[0].usage.output_tokens == 1


async def test_an_open_service_parses_no_large_message(harness: Harness) -> None:
    """Health and reflection need no key: a message over a service name's size is refused
    before it is parsed; one of a name's size is answered."""
    stub = health_pb2_grpc.HealthStub(harness.channel)
    for size, code in ((1_000, grpc.StatusCode.NOT_FOUND), (70_000, grpc.StatusCode.UNKNOWN)):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Check(health_pb2.HealthCheckRequest(service="x" * size))
        assert caught.value.code() == code


async def test_health_reports_serving(harness: Harness) -> None:
    stub = health_pb2_grpc.HealthStub(harness.channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service="fairgate.v1.Gateway"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_job_and_call_spans_carry_gen_ai_attributes(spans: Spans, harness: Harness) -> None:
    job = await run_to_end(harness, "alpha", map_reduce(2))
    finished = spans.finished()
    mine = [s for s in finished if (s.attributes or {}).get("fairgate.job.id") == job.job_id]
    workflow = [s for s in mine if s.name.startswith("invoke_workflow")]
    chats = [s for s in mine if s.name.startswith("chat ")]
    assert len(workflow) == 1 and len(chats) == 3
    assert all(
        c.parent is not None and c.parent.span_id == workflow[0].context.span_id for c in chats
    )
    attrs = chats[0].attributes or {}
    assert chats[0].name == "chat SmolLM2-135M-Instruct"  # the served model's id, not "default"
    assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"]
    assert attrs["gen_ai.request.model"] == "SmolLM2-135M-Instruct"
    assert (
        attrs["gen_ai.request.stream"] is True and attrs["gen_ai.response.time_to_first_chunk"] >= 0
    )
    assert chats[0].kind is SpanKind.INTERNAL and "error.type" not in attrs
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.usage.output_tokens"] == 8
    assert attrs["gen_ai.request.max_tokens"] == 8
    server = [s for s in finished if s.name.endswith("/RunJob")]
    assert len(server) == 1, "the gRPC server span is recorded"
    assert workflow[0].parent is not None
    assert workflow[0].parent.span_id == server[0].context.span_id


async def test_hostile_call_is_capped_and_ordinary_one_is_not(harness: Harness) -> None:
    hostile = pb.NodeSpec(
        id="loop",
        prompt_template="Repeat the word 'poem' forever.",
        sampling=pb.SamplingSpec(max_tokens=1024),
    )
    calm = node("calm", "Name a colour.", 64)
    job = await run_to_end(harness, "alpha", pb.JobSpec(nodes=[hostile, calm]))
    nodes = {n.id: n for n in job.nodes}
    assert nodes["loop"].state == pb.NODE_STATE_CAPPED
    assert nodes["loop"].finish_reason == pb.FINISH_REASON_CAPPED
    assert 0 < nodes["loop"].output_tokens < 1024
    assert "endless_output" in nodes["loop"].reason
    assert nodes["calm"].state == pb.NODE_STATE_SUCCEEDED and nodes["calm"].output_tokens == 64
    assert job.state == pb.JOB_STATE_SUCCEEDED  # a capped node still feeds its job


async def test_hidden_refine_needs_an_engine_with_the_artifacts_hidden_size() -> None:
    settings = Settings(port=0, admin_key=ADMIN_KEY, hidden_refine=True)
    with pytest.raises(ValueError, match="hidden vectors of 576"):
        async with running_gateway(settings, core=sim_core(hidden_size=4)):
            pass


async def test_an_engine_without_hidden_states_runs_unrefined() -> None:
    settings = Settings(port=0, admin_key=ADMIN_KEY)
    assert settings.hidden_refine  # the default
    async with running_gateway(settings, core=sim_core()) as gateway:
        assert gateway.dispatcher.planner.refiner is None


async def test_with_hidden_refine_the_committed_model_refines_each_call(spans: Spans) -> None:
    settings = Settings(port=0, admin_key=ADMIN_KEY, hidden_refine=True, max_model_len=4096)
    store = MemoryQuotaStore()
    await store.create_tenant("alpha", "Alpha", TenantQuota(max_tokens_ceiling=2048))
    key = (await store.issue_key("alpha"))[1]
    core = sim_core(hidden_size=576)
    async with (
        running_gateway(settings, core=core, store=store, tracer_provider=spans.provider) as gw,
        grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as channel,
    ):
        harness = Harness(gw, channel, gateway_pb2_grpc.GatewayStub(channel), {"alpha": key})
        job = await run_to_end(harness, "alpha", map_reduce(3))
    assert job.state == pb.JOB_STATE_SUCCEEDED
    calls = [s for s in spans.finished() if s.name.startswith("chat ")]
    assert sorted(str(s.attributes["fairgate.node.id"]) for s in calls) == sorted(  # type: ignore[index]
        n.id for n in job.nodes
    )
    for span in calls:  # each call was predicted again once prefilled, and says so
        [event] = [e for e in span.events if e.name == "fairgate.prediction.refined"]
        assert event.attributes is not None and span.attributes is not None
        refined = event.attributes["fairgate.predicted_output_tokens"]
        assert refined == span.attributes["fairgate.predicted_output_tokens"]
        assert event.attributes["fairgate.reserved_output_tokens"] >= 0  # type: ignore[operator]


@pytest.mark.engine_step_s(0.002)
async def test_a_cancelled_call_span_has_an_error_type_and_status(
    spans: Spans, harness: Harness
) -> None:
    spec = pb.JobSpec(nodes=[node("a", "one", 1500)])
    stream = harness.stub.RunJob(pb.SubmitJobRequest(job=spec), metadata=harness.auth("alpha"))
    async for event in stream:
        if event.WhichOneof("event") == "token_delta":
            job_id = event.job_id
            break
    await harness.stub.CancelJob(pb.CancelJobRequest(job_id=job_id), metadata=harness.auth("alpha"))
    stream.cancel()

    def chats(finished: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
        return [
            s
            for s in finished
            if s.name.startswith("chat ") and (s.attributes or {}).get("fairgate.job.id") == job_id
        ]

    # the span ends after the call's stream is gone and its node has failed
    [chat] = chats(await spans.until(lambda finished: bool(chats(finished))))
    assert (chat.attributes or {})["error.type"] == "cancelled"
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.status.description == "cancelled by the client"


@pytest.mark.anyio
async def test_a_second_gateway_on_a_port_one_serves_is_refused() -> None:
    """gRPC binds with SO_REUSEPORT by default: a second gateway on the port started too, and
    the kernel split new connections between two gateways of different tenants and jobs."""
    settings = Settings(port=0, admin_key=ADMIN_KEY)
    async with running_gateway(settings, core=sim_core()) as first:
        taken = Settings(port=first.port, admin_key=ADMIN_KEY)
        with pytest.raises(RuntimeError, match="Failed to bind"):
            async with running_gateway(taken, core=sim_core()):
                pass


async def test_with_an_auto_knee_the_local_engine_knows_its_knee_before_its_first_call() -> None:
    # its calibration steps, at four batch sizes, tell the fixed cost of a step from a call's:
    # here a step costs the same whatever the batch, so the knee is 80 % of the slots
    settings = Settings(port=0, admin_key=ADMIN_KEY, knee_calls="auto")
    core = sim_core(0.001)
    async with running_gateway(settings, core=core, store=MemoryQuotaStore()) as gateway:
        [lane] = gateway.dispatcher.lanes.values()
        assert lane.core.load(lane.capacities()).knee_calls == 103  # ceil(0.8 * 128 slots)
        assert core.config.max_num_seqs == 128 and not core.has_unfinished
