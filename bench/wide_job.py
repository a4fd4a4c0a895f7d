"""`fairgate bench wide`: what streaming one wide job costs the gateway.

One tenant runs one job of `--nodes` parallel calls that each generate `--tokens` tokens (far
past the prediction of a short prompt's output, so the policy charges every token beyond it)
through the whole gRPC path: `RunJob` on a gateway in this process over the simulated engine
with instant steps and the memory store, so what takes time is the gateway (the engine's own
scheduling included). Figures, medians over `--repeats` runs: the job's wall time, the tokens
made per second, and the longest the event loop was held at once meanwhile (every other
tenant's RPCs and streams wait that long).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import grpc

from bench.loop_watch import LoopWatch
from bench.repeats import medians, write_json
from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.server import running_gateway
from gateway.settings import Settings
from tenants import MemoryQuotaStore, TenantQuota

KV_CACHE_MB = 16_384  # the simulated engine holds no tensors: room for every call at once


@dataclass(frozen=True, slots=True)
class WideRun:
    seconds: float
    tokens_per_s: float
    longest_hold_ms: float


def wide_job(nodes: int, tokens: int) -> pb.SubmitJobRequest:
    sampling = pb.SamplingSpec(max_tokens=tokens)
    specs = [pb.NodeSpec(id=f"n{i}", prompt_template="hi", sampling=sampling) for i in range(nodes)]
    return pb.SubmitJobRequest(job=pb.JobSpec(nodes=specs))


async def measure(nodes: int, tokens: int) -> WideRun:
    settings = Settings(
        port=0,
        simulated_engine=True,
        max_model_len=tokens + 64,
        max_num_seqs=nodes,
        kv_cache_mb=KV_CACHE_MB,
        ignore_eos=True,
    )
    store = MemoryQuotaStore()
    await store.create_tenant(
        "t", "t", TenantQuota(max_tokens_ceiling=tokens, default_max_tokens=tokens)
    )
    metadata = (("authorization", f"Bearer {(await store.issue_key('t'))[1]}"),)
    async with (
        running_gateway(settings, store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
        anyio.create_task_group() as tg,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        watch = LoopWatch()
        tg.start_soon(watch.watch)
        start = time.perf_counter()
        made = 0
        async for event in stub.RunJob(wide_job(nodes, tokens), metadata=metadata):
            if event.HasField("job_finished"):  # (deltas of ended nodes may be dropped unread)
                made = sum(node.output_tokens for node in event.job_finished.job.nodes)
        seconds = time.perf_counter() - start
        watch.watching = False
    if made != nodes * tokens:
        raise RuntimeError(f"{made} tokens made of {nodes * tokens}")
    return WideRun(seconds, made / seconds, watch.longest * 1e3)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=256, help="parallel calls in the job")
    parser.add_argument("--tokens", type=int, default=1024, help="each call's output tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    runs = [anyio.run(measure, args.nodes, args.tokens) for _ in range(args.repeats)]
    figures = medians(runs)
    print(
        f"one job of {args.nodes} calls x {args.tokens} tokens: {figures['seconds']:.1f} s, "
        f"{figures['tokens_per_s']:.0f} tokens/s, the event loop held at most "
        f"{figures['longest_hold_ms']:.0f} ms at once (median of {len(runs)} runs)"
    )
    write_json(args, figures, runs)


if __name__ == "__main__":
    main()
