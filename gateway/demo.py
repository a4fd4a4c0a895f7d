"""`fairgate demo`: a gateway on the embedded defaults and three tenants running agent jobs.

Three tenants with different weights and job shapes (map-reduce summaries, plan-execute-review
chains, parallel sampling with a vote) submit jobs at once over gRPC; the terminal shows each
tenant's progress live, then a summary table and a sample of the model's text.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import grpc

from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.server import running_gateway
from gateway.settings import Settings
from tenants import TenantQuota

DOCS = [
    "Solar panels convert sunlight into electricity using photovoltaic cells made of silicon.",
    "Honeybees communicate the location of flowers to their hive mates through a waggle dance.",
    "The Roman aqueducts carried water over long distances using a gentle, constant slope.",
    "Vaccines train the immune system to recognise a pathogen without causing the disease.",
]
QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 7 times 8?"]
TASKS = ["plan a picnic", "learn to juggle", "start a vegetable garden"]


def _node(node_id: str, prompt: str, max_tokens: int, *deps: str, **sampling: float) -> pb.NodeSpec:
    spec = pb.SamplingSpec(max_tokens=max_tokens, **sampling)  # type: ignore[arg-type]
    return pb.NodeSpec(id=node_id, prompt_template=prompt, depends_on=deps, sampling=spec)


def map_reduce_job(i: int) -> pb.JobSpec:
    maps = [
        _node(f"map_{k}", f"Summarise in one sentence: {{{{inputs.doc_{k}}}}}", 40)
        for k in range(len(DOCS))
    ]
    joined = "\n".join(f"- {{{{map_{k}.output}}}}" for k in range(len(DOCS)))
    reduce = _node("reduce", f"Write a title for these notes:\n{joined}", 24, *(m.id for m in maps))
    inputs = {f"doc_{k}": DOCS[(k + i) % len(DOCS)] for k in range(len(DOCS))}
    return pb.JobSpec(name=f"summaries-{i}", nodes=[*maps, reduce], inputs=inputs)


def chain_job(i: int) -> pb.JobSpec:
    task = TASKS[i % len(TASKS)]
    plan = _node("plan", f"Give three short steps to {task}.", 48)
    act = _node("execute", "Expand the first step in two sentences:\n{{plan.output}}", 48, "plan")
    review = _node("review", "Name one risk in this plan:\n{{execute.output}}", 32, "execute")
    return pb.JobSpec(name=f"chain-{i}", nodes=[plan, act, review])


def vote_job(i: int) -> pb.JobSpec:
    question = QUESTIONS[i % len(QUESTIONS)]
    samples = [
        _node(f"sample_{k}", question, 24, temperature=0.9, seed=100 * i + k) for k in range(4)
    ]
    answers = "\n".join(f"{k + 1}. {{{{sample_{k}.output}}}}" for k in range(4))
    vote = _node(
        "vote",
        f"{question}\nCandidate answers:\n{answers}\nThe best answer is",
        24,
        *(s.id for s in samples),
    )
    return pb.JobSpec(name=f"vote-{i}", nodes=[*samples, vote])


@dataclass
class TenantPlan:
    tenant_id: str
    weight: float
    make_job: Callable[[int], pb.JobSpec]


@dataclass
class Progress:
    jobs_total: int
    jobs_done: int = 0
    nodes_done: int = 0
    nodes_total: int = 0
    tokens: int = 0
    jct: list[float] = field(default_factory=list)
    sample: str = ""


PLANS = [
    TenantPlan("acme", 2.0, map_reduce_job),
    TenantPlan("globex", 1.0, chain_job),
    TenantPlan("initech", 1.0, vote_job),
]


async def run_demo(settings: Settings, jobs_per_tenant: int = 3) -> int:
    settings = settings.model_copy(update={"port": 0})
    print(f"fairgate demo: loading {settings.model} ({settings.dtype}) ...", flush=True)
    started = time.monotonic()
    async with running_gateway(settings) as gateway:
        print(
            f"server ready on port {gateway.port} in {time.monotonic() - started:.1f}s; "
            f"policy {settings.policy}; {len(PLANS)} tenants x {jobs_per_tenant} jobs\n"
        )
        progress = {p.tenant_id: Progress(jobs_per_tenant) for p in PLANS}
        keys = {}
        for plan in PLANS:
            await gateway.store.create_tenant(
                plan.tenant_id, plan.tenant_id.title(), TenantQuota(weight=plan.weight)
            )
            keys[plan.tenant_id] = (await gateway.store.issue_key(plan.tenant_id))[1]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            t0 = time.monotonic()
            async with anyio.create_task_group() as tg:
                for plan in PLANS:
                    for i in range(jobs_per_tenant):
                        tg.start_soon(
                            _run_job,
                            stub,
                            keys[plan.tenant_id],
                            plan.make_job(i),
                            progress[plan.tenant_id],
                            t0,
                        )
                tg.start_soon(_show, progress, tg.cancel_scope)
        _summary(progress, time.monotonic() - t0)
    return 0


async def _run_job(
    stub: gateway_pb2_grpc.GatewayStub, key: str, spec: pb.JobSpec, progress: Progress, t0: float
) -> None:
    progress.nodes_total += len(spec.nodes)
    metadata = (("authorization", f"Bearer {key}"),)
    submitted = time.monotonic()
    async for event in stub.RunJob(pb.SubmitJobRequest(job=spec), metadata=metadata):
        kind = event.WhichOneof("event")
        if kind == "token_delta":
            progress.tokens += event.token_delta.token_count
        elif kind == "node_state_changed":
            if event.node_state_changed.node.state >= pb.NODE_STATE_SUCCEEDED:
                progress.nodes_done += 1
        elif kind == "job_finished":
            job = event.job_finished.job
            progress.jobs_done += 1
            progress.jct.append(time.monotonic() - submitted)
            last = job.nodes[-1]
            progress.sample = f"{job.name} / {last.id}: {last.output.strip()}"


async def _show(progress: dict[str, Progress], scope: anyio.CancelScope) -> None:
    lines = 0
    while True:
        if lines:
            sys.stdout.write(f"\x1b[{lines}F")
        rows = [
            f"  {tenant:<8} jobs {p.jobs_done}/{p.jobs_total}  nodes {p.nodes_done:>3}/"
            f"{p.nodes_total:<3}  tokens {p.tokens:>5}  {_bar(p)}"
            for tenant, p in progress.items()
        ]
        sys.stdout.write("".join(f"{row}\x1b[K\n" for row in rows))
        sys.stdout.flush()
        lines = len(rows)
        if all(p.jobs_done == p.jobs_total for p in progress.values()):
            scope.cancel()
            return
        await anyio.sleep(0.25)


def _bar(p: Progress, width: int = 24) -> str:
    done = int(width * p.nodes_done / p.nodes_total) if p.nodes_total else 0
    return "[" + "#" * done + "." * (width - done) + "]"


def _summary(progress: dict[str, Progress], elapsed: float) -> None:
    print(f"\nall jobs finished in {elapsed:.1f}s\n")
    print(
        f"  {'tenant':<8} {'jobs':>4} {'nodes':>5} {'tokens':>6} {'avg JCT s':>9} {'max JCT s':>9}"
    )
    for tenant, p in progress.items():
        avg = sum(p.jct) / len(p.jct) if p.jct else float("nan")
        print(
            f"  {tenant:<8} {p.jobs_done:>4} {p.nodes_done:>5} {p.tokens:>6} "
            f"{avg:>9.1f} {max(p.jct, default=float('nan')):>9.1f}"
        )
    print("\nlast output of each tenant:")
    for tenant, p in progress.items():
        print(f"  [{tenant}] {p.sample[:160]}")
