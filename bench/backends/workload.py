"""The benchmark's jobs, each call planned down to the token ids and max_tokens the gateway sends.

The jobs are the live check's (`bench.live.check.live_workload`: the study's generator, think
delays removed, jobs deeper than the gateway allows dropped, token counts times `scale`, arrivals
spread over `window_s`), as gateway job specs (`bench.workloads.replay.to_job_spec`). Each node's
prompt is rendered (`gateway.jobs.template.render_node`; the filler prompts reference no
ancestor, so a call's prompt does not depend on what its parents generated) and encoded with the
gateway's own encoder and the served model's chat template (`gateway.prompts.PromptEncoder`),
and its max_tokens is the gateway's: the node's, within the tenant's ceiling and what the
context leaves after the prompt. `as_run` gives the jobs as they run (those prompt counts, every
call generating its max_tokens, no think delays) for the GPS reference. Invariant: the direct
client and the gateway send each call the same ids and the same max_tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench.backends.config import BenchConfig
from bench.live.check import LiveConfig, live_workload
from bench.live.replay import output_ceiling
from bench.workloads.format import Job, Node
from bench.workloads.replay import to_job_spec
from engine.loader import load_tokenizer
from gateway.jobs.model import JobSpec
from gateway.jobs.template import render_node
from gateway.prompts import Prompt, PromptEncoder, prompt_text


@dataclass(frozen=True, slots=True)
class PlannedCall:
    node_id: str
    parents: tuple[str, ...]
    text: str  # the rendered prompt, before the chat template
    prompt_ids: tuple[int, ...]  # with the chat template, as the gateway encodes it
    max_tokens: int  # as the gateway enforces it; with ignore_eos, the tokens generated


@dataclass(frozen=True, slots=True)
class PlannedJob:
    job: Job  # the workload's job; `arrival` is seconds after the run's start
    spec: JobSpec  # what the gateway is sent
    calls: tuple[PlannedCall, ...]  # in the spec's order

    @property
    def output_tokens(self) -> int:
        return sum(c.max_tokens for c in self.calls)


@dataclass(frozen=True, slots=True)
class Workload:
    jobs: tuple[PlannedJob, ...]  # by arrival
    ceiling: int  # the tenants' max_tokens ceiling
    dropped: int  # jobs built but deeper than the gateway allows

    @property
    def tenants(self) -> dict[str, float]:
        """Tenant -> weight."""
        return {p.job.tenant: p.job.weight for p in self.jobs}


def plan_job(
    job: Job,
    scale: float,
    encode: Callable[[Prompt], list[int]],
    ceiling: int,
    max_model_len: int,
) -> PlannedJob:
    spec = to_job_spec(job, scale)
    calls = []
    for node in spec.nodes:
        prompt = render_node(node, {}, {})
        ids = tuple(encode(prompt))
        asked = min(node.sampling.max_tokens or 1, ceiling)
        max_tokens = min(asked, max_model_len - len(ids))
        if max_tokens < 1:
            raise ValueError(f"job {job.job_id} node {node.id}: a prompt of {len(ids)} tokens")
        calls.append(PlannedCall(node.id, node.depends_on, prompt_text(prompt), ids, max_tokens))
    return PlannedJob(job, spec, tuple(calls))


def plan_workload(config: BenchConfig, tokenizer_dir: Path, max_model_len: int) -> Workload:
    live = LiveConfig(
        config.data,
        config.out,
        jobs=config.jobs,
        seed=config.seed,
        scale=config.scale,
        window_s=config.window_s,
    )
    jobs, dropped = live_workload(live)
    ceiling = output_ceiling(jobs, config.scale)
    encode = PromptEncoder(load_tokenizer(tokenizer_dir))
    planned = [plan_job(j, config.scale, encode, ceiling, max_model_len) for j in jobs]
    planned.sort(key=lambda p: (p.job.arrival, p.job.job_id))
    return Workload(tuple(planned), ceiling, dropped)


def as_run(jobs: Sequence[PlannedJob]) -> list[Job]:
    """The jobs as they run: the encoded prompts, every call to its max_tokens, no think."""
    return [
        replace(
            p.job,
            nodes=tuple(
                Node(c.node_id, c.parents, len(c.prompt_ids), c.max_tokens, c.max_tokens)
                for c in p.calls
            ),
        )
        for p in jobs
    ]


def burst(jobs: Sequence[PlannedJob]) -> list[PlannedJob]:
    """The jobs all arriving at the start, in their order."""
    return [replace(p, job=p.job.at(0.0)) for p in jobs]
