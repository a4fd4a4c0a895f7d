"""The hostile tenants of `fairgate bench neighbours`, each in a process of its own.

A hostile process waits for the bench's "begin", behaves until its "stop", then answers with
how many of its RPCs were answered and refused; it tells the bench "ready" once its behaviour is
under way (its first refusal, its streams open, its job done). The behaviours are named in
bench/neighbours.py's docstring.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Set
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import anyio
import grpc

from bench.strangers import packed_request
from bench.wide_job import wide_job
from fairgate.connection import error_from_rpc
from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.settings import Settings
from tenants import TenantQuota

NODES, WIDE_TOKENS = 256, 512  # a wide job; the getjob phase's job is as wide
GETJOB_TOKENS = 64  # its job's calls: 4 rounds of the engine's 64 slots, 2.6 s
GETJOB_READERS = 32
CHAIN_NODES, CHAIN_TOKENS = 32, 512  # the streams' job: one call at a time for 164 s
DENSE_ROOTS = 128  # a dense job: as many roots, and as many nodes depending on all of them
SENDERS = 4  # concurrent callers of the dense and packed phases
MAX_MESSAGE_BYTES = Settings().max_message_bytes  # the gateway's: what a packed request fills
HOSTILE_QUOTA = TenantQuota()  # every hostile tenant's: the defaults
# how the gateway refuses the hostile tenants: its limits, or their invalid jobs
REFUSED = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT}
# ... and its streams: past the quota, and some opened at once before it (CANCELLED)
OPEN_REFUSED = REFUSED | {grpc.StatusCode.CANCELLED}
SUBMIT = "/fairgate.v1.Gateway/SubmitJob"
Metadata = tuple[tuple[str, str]]


@dataclass(slots=True)
class Tally:
    """What a hostile tenant got, and the word to the bench once its behaviour is under way."""

    conn: Connection
    ok: int = 0
    refused: int = 0
    under_way: bool = False

    def ready(self) -> None:
        if not self.under_way:
            self.under_way = True
            self.conn.send("ready")

    async def answered(
        self, call: Awaitable[object], refused: Set[grpc.StatusCode] = REFUSED
    ) -> bool:
        """Await `call`, counting its answer or its refusal; whether it was answered."""
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in refused:
                raise
            self.refused += 1
            return False
        self.ok += 1
        return True


def dense_job() -> pb.SubmitJobRequest:
    """256 nodes, half depending on all of the other half; one temperature of -1 (invalid)."""
    roots = [f"r{i}" for i in range(DENSE_ROOTS)]
    nodes = [pb.NodeSpec(id=root, prompt_template="hi") for root in roots]
    nodes += [
        pb.NodeSpec(id=f"d{i}", prompt_template="hi", depends_on=roots) for i in range(DENSE_ROOTS)
    ]
    nodes[-1].sampling.temperature = -1
    return pb.SubmitJobRequest(job=pb.JobSpec(nodes=nodes))


def chain_job() -> pb.SubmitJobRequest:
    nodes = [
        pb.NodeSpec(
            id=f"c{i}",
            prompt_template="hi",
            depends_on=[f"c{i - 1}"] if i else [],
            sampling=pb.SamplingSpec(max_tokens=CHAIN_TOKENS),
        )
        for i in range(CHAIN_NODES)
    ]
    return pb.SubmitJobRequest(job=pb.JobSpec(nodes=nodes))


def packed_job(max_message_bytes: int) -> bytes:
    """A SubmitJobRequest just within the message limit, its job as many empty nodes as fit."""
    return packed_request(
        pb.SubmitJobRequest(job=pb.JobSpec(nodes=[pb.NodeSpec()])), max_message_bytes
    )


async def _wide(channel: grpc.aio.Channel, metadata: Metadata, tally: Tally) -> None:
    stub, request = gateway_pb2_grpc.GatewayStub(channel), wide_job(NODES, WIDE_TOKENS)
    while True:
        try:
            await stub.SubmitJob(request, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            error = error_from_rpc(exc)
            if error.retry_after_s is None:
                raise
            tally.refused += 1
            await anyio.sleep(error.retry_after_s)
        else:
            tally.ok += 1
            tally.ready()


async def _getjob(channel: grpc.aio.Channel, metadata: Metadata, tally: Tally) -> None:
    stub = gateway_pb2_grpc.GatewayStub(channel)
    job = await stub.SubmitJob(wide_job(NODES, GETJOB_TOKENS), metadata=metadata)
    async for _ in stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), metadata=metadata):
        pass  # the stream ends with the job
    request = pb.GetJobRequest(job_id=job.job_id)

    async def reader() -> None:
        while True:
            await tally.answered(stub.GetJob(request, metadata=metadata))
            tally.ready()

    async with anyio.create_task_group() as tg:
        for _ in range(GETJOB_READERS):
            tg.start_soon(reader)


async def _streams(channel: grpc.aio.Channel, metadata: Metadata, tally: Tally) -> None:
    """Its quota's streams and one more (refused) opened at once: one after another, each
    would replay a longer log to a loop the streams open so far keep busier."""
    stub = gateway_pb2_grpc.GatewayStub(channel)
    job = await stub.SubmitJob(chain_job(), metadata=metadata)
    request = pb.WatchJobRequest(job_id=job.job_id)
    answered = 0

    async def watch() -> None:
        nonlocal answered
        call = stub.WatchJob(request, metadata=metadata)
        opened = await tally.answered(call.read(), OPEN_REFUSED)  # the first event, or not
        answered += 1
        if answered > HOSTILE_QUOTA.max_streams:
            tally.ready()
        while opened and await call.read() != grpc.aio.EOF:
            pass

    async with anyio.create_task_group() as tg:
        for _ in range(HOSTILE_QUOTA.max_streams + 1):
            tg.start_soon(watch)


async def _refused(
    channel: grpc.aio.Channel, metadata: Metadata, tally: Tally, method: str, body: bytes
) -> None:
    """`SENDERS` callers sending `body` to `method` one after another, as fast as refused."""
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)

    async def sender() -> None:
        while True:
            await tally.answered(call(body, metadata=metadata))
            tally.ready()

    async with anyio.create_task_group() as tg:
        for _ in range(SENDERS):
            tg.start_soon(sender)


async def _dense(channel: grpc.aio.Channel, metadata: Metadata, tally: Tally) -> None:
    await _refused(channel, metadata, tally, SUBMIT, dense_job().SerializeToString())


async def _packed(channel: grpc.aio.Channel, metadata: Metadata, tally: Tally) -> None:
    await _refused(channel, metadata, tally, SUBMIT, packed_job(MAX_MESSAGE_BYTES))


Behaviour = Callable[[grpc.aio.Channel, Metadata, Tally], Coroutine[Any, Any, None]]
BEHAVIOURS: dict[str, Behaviour] = {
    "wide": _wide,
    "getjob": _getjob,
    "streams": _streams,
    "dense": _dense,
    "packed": _packed,
}


async def _hostile(phase: str, port: int, key: str, conn: Connection) -> None:
    """Wait for "begin", behave until "stop", then send what was answered and refused."""
    tally = Tally(conn)
    metadata = (("authorization", f"Bearer {key}"),)
    options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        await _word(conn)
        async with anyio.create_task_group() as tg:
            tg.start_soon(BEHAVIOURS[phase], channel, metadata, tally)
            await _word(conn)
            tg.cancel_scope.cancel()
    conn.send((tally.ok, tally.refused))


async def _word(conn: Connection) -> None:
    """The bench's next word (without a thread, so a failing behaviour cancels the wait)."""
    await anyio.wait_readable(conn.fileno())
    conn.recv()


def hostile_process(phase: str, port: int, key: str, conn: Connection) -> None:
    anyio.run(_hostile, phase, port, key, conn)
