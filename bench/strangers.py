"""`fairgate bench strangers`: what callers without a key cost the tenants.

A gateway (this process; the simulated engine with instant steps, the memory store) serves one
tenant's client, in a process of its own, sending single-call `Generate` requests one after
another for `--seconds`: first alone, then while `--strangers` concurrent callers in a third
process send requests with no key as fast as they are refused. Each stranger's request is the
worst a message of `max_message_bytes` (16 MiB) can be to parse: millions of empty chat
messages, over a second of the gateway's one event loop were it parsed. The failure throttle is
off, as it would be for strangers on many addresses. With `--keyed` the same requests come with
a key of another tenant's: they are parsed, and that tenant's share of the event loop for
parsing (`max_loop_share_per_tenant`) is what bounds them. Figures: the tenant's calls per
second and call time p50 / p99, alone and beside the strangers (medians over `--repeats` runs),
and the strangers' requests per second.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
import numpy as np
from google.protobuf import wrappers_pb2
from google.protobuf.message import Message

from bench.gateway_overhead import one_call
from bench.repeats import medians, write_json
from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.server import running_gateway
from gateway.settings import Settings
from tenants import MemoryQuotaStore, TenantQuota

EMPTY_MESSAGE_BYTES = 2  # a repeated message field's tag and a zero length
ENVELOPE_BYTES = 32  # room for the chat field's own tag and length within the limit


@dataclass(frozen=True, slots=True)
class StrangersRun:
    alone_calls_per_s: float
    beside_calls_per_s: float
    alone_p50_ms: float
    alone_p99_ms: float
    beside_p50_ms: float
    beside_p99_ms: float
    stranger_requests_per_s: float


def packed_request(one: Message, max_message_bytes: int) -> bytes:
    """`one`, a request whose one field holds one empty item of a repeated field (a
    GenerateRequest of one empty chat message, a SubmitJobRequest of one empty node), with as
    many empty items as fit within the message limit: the worst such a message can be to
    parse. Built as bytes (adding millions of items one by one takes seconds): the field is
    framed as BytesValue frames its own, under the request's tag."""
    framed = one.SerializeToString()
    tag, item = framed[:1], framed[2:]
    assert framed[1] == len(item) == EMPTY_MESSAGE_BYTES  # a one-byte tag and length each
    count = (max_message_bytes - ENVELOPE_BYTES) // EMPTY_MESSAGE_BYTES
    return tag + wrappers_pb2.BytesValue(value=item * count).SerializeToString()[1:]


def worst_request(max_message_bytes: int) -> bytes:
    """A GenerateRequest just within the message limit, of as many empty chat messages as fit."""
    one = pb.GenerateRequest(chat=pb.ChatPrompt(messages=[pb.ChatMessage()]))
    return packed_request(one, max_message_bytes)


async def tenant_calls(
    port: int,
    key: str,
    seconds: float,
    max_tokens: int = 1,
    warmed: Callable[[], object] = lambda: None,
) -> tuple[list[float], float]:
    """A tenant's `Generate` calls one after another for `seconds`, after a warm-up; `warmed`
    runs (in a thread: it may block) between the two. Returns the calls' times and how long the
    call cut off at the end had run."""
    metadata = (("authorization", f"Bearer {key}"),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        for _ in range(20):  # warm-up: the connection, the code paths
            await one_call(stub, metadata, max_tokens)
        await anyio.to_thread.run_sync(warmed)
        latencies: list[float] = []
        start = time.perf_counter()
        with anyio.move_on_after(seconds):
            while True:
                start = time.perf_counter()
                latencies.append(await one_call(stub, metadata, max_tokens))
        return latencies, time.perf_counter() - start


def _tenant_process(port: int, key: str, seconds: float, out: Any) -> None:
    out.put(anyio.run(tenant_calls, port, key, seconds)[0])


# what the gateway answers the strangers: without a key, and with one (their requests parsed,
# then refused for their message count, or not parsed past their tenant's share)
REFUSED = {
    False: {grpc.StatusCode.UNAUTHENTICATED},
    True: {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED},
}


async def _strangers(port: int, strangers: int, size: int, key: str, out: Any, stop: Any) -> None:
    body = worst_request(size)
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    options = [("grpc.max_send_message_length", size)]
    sent = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        generate: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
            "/fairgate.v1.Gateway/Generate"
        )

        async def stranger() -> None:
            nonlocal sent
            while not stop.is_set():
                try:
                    async for _ in generate(body, metadata=metadata):
                        pass
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in REFUSED[bool(key)]:
                        raise
                sent += 1
                if sent == strangers:
                    out.put(None)  # every stranger is sending

        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for _ in range(strangers):
                tg.start_soon(stranger)
        out.put(sent / (anyio.current_time() - start))


def _strangers_process(port: int, strangers: int, size: int, key: str, out: Any, stop: Any) -> None:
    anyio.run(_strangers, port, strangers, size, key, out, stop)


def percentiles_ms(latencies: list[float]) -> tuple[float, float]:
    """p50 and p99 of call times in seconds, in milliseconds."""
    ms = np.array(latencies) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


async def measure(
    seconds: float, strangers: int, message_bytes: int, keyed: bool = False
) -> StrangersRun:
    """One run: the tenant alone, then beside the strangers (with a key of their own tenant's
    when `keyed`)."""
    # no failure throttle: every stranger's request is checked, as from strangers on many
    # addresses (one address is throttled after a few tries)
    settings = Settings(
        port=0,
        simulated_engine=True,
        policy="justitia",
        auth_failures_per_minute=10**9,
        max_message_bytes=message_bytes,
    )
    store = MemoryQuotaStore()
    await store.create_tenant("t", "t", TenantQuota())
    key = (await store.issue_key("t"))[1]
    their_key = ""
    if keyed:
        await store.create_tenant("s", "s", TenantQuota())
        their_key = (await store.issue_key("s"))[1]
    context = multiprocessing.get_context("spawn")
    async with running_gateway(settings, store=store) as gateway:
        port = gateway.port

        async def tenant() -> list[float]:
            results = context.Queue()
            process = context.Process(target=_tenant_process, args=(port, key, seconds, results))
            process.start()
            latencies: list[float] = await anyio.to_thread.run_sync(results.get)
            await anyio.to_thread.run_sync(process.join)
            return latencies

        alone = await tenant()
        news, stop = context.Queue(), context.Event()
        size = settings.max_message_bytes
        flood = context.Process(
            target=_strangers_process, args=(port, strangers, size, their_key, news, stop)
        )
        flood.start()
        await anyio.to_thread.run_sync(news.get)  # every stranger has been refused once
        beside = await tenant()
        stop.set()
        rate: float = await anyio.to_thread.run_sync(news.get)
        await anyio.to_thread.run_sync(flood.join)
    rates = (len(alone) / seconds, len(beside) / seconds)
    return StrangersRun(*rates, *percentiles_ms(alone), *percentiles_ms(beside), rate)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="each phase's length")
    parser.add_argument("--strangers", type=int, default=4, help="concurrent callers, no key")
    parser.add_argument(
        "--message-bytes", type=int, default=Settings().max_message_bytes, help="the limit"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keyed", action="store_true", help="the strangers hold a tenant's key")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    runs = [
        anyio.run(measure, args.seconds, args.strangers, args.message_bytes, args.keyed)
        for _ in range(args.repeats)
    ]
    figures = medians(runs)
    print(
        f"a tenant's calls/s, p50 / p99: alone {figures['alone_calls_per_s']:.0f}, "
        f"{figures['alone_p50_ms']:.1f} / {figures['alone_p99_ms']:.1f} ms; beside "
        f"{args.strangers} strangers ({figures['stranger_requests_per_s']:.1f} requests/s of "
        f"{args.message_bytes} bytes) {figures['beside_calls_per_s']:.1f}, "
        f"{figures['beside_p50_ms']:.1f} / {figures['beside_p99_ms']:.1f} ms "
        f"(median of {len(runs)} runs)"
    )
    write_json(args, figures, runs)


if __name__ == "__main__":
    main()
