"""The `direct` arm: every job's calls sent straight to the server as their DAG allows.

What users of a vLLM server do today: a client per job that, at the job's arrival offset, sends
each node's call as soon as its parents are done, the server queueing what it cannot run yet.
A call is the gateway's own request (`gateway.backends.wire.completion_body`: the same token
ids, max_tokens, greedy sampling, `ignore_eos`, a stream with its usage) read with the gateway's
own decoder (`gateway.backends.decoder`), so the arms differ only in who orders the calls.
`until_work` stops the run once that much KV token-time has streamed (the capacity probe),
cutting the calls still running (closing a stream aborts it on the server). Invariant: no call
is sent before all its parents have finished, nor before its job's arrival.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import httpx
from httpx_sse import EventSource

from bench.backends.config import TEMPERATURE, TOP_P
from bench.backends.records import ArmRun, CallRecord, JobRecord
from bench.backends.workload import PlannedCall, PlannedJob
from engine import SamplingParams
from gateway.backends.base import BackendCall
from gateway.backends.decoder import CompletionDecoder
from gateway.backends.errors import BackendError
from gateway.backends.wire import completion_body
from tenants.policies import kv_token_time


class DirectCallFailed(RuntimeError):
    """The server refused or broke a call of the direct arm."""


def request_body(call: PlannedCall, request_id: str, model: str) -> dict[str, object]:
    params = SamplingParams(
        max_tokens=call.max_tokens, temperature=TEMPERATURE, top_p=TOP_P, ignore_eos=True
    )
    return completion_body(BackendCall(request_id, list(call.prompt_ids), params), model, False)


@dataclass(slots=True)
class _Stream:
    """One call's stream as it goes."""

    sent: float
    tokens: int = 0
    deltas: list[tuple[float, int]] = field(default_factory=list)
    finished: float | None = None


@dataclass(slots=True)
class _Run:
    http: httpx.AsyncClient
    model: str
    label: str
    start: float
    until_work: float | None
    work: float = 0.0
    streams: dict[tuple[str, str], tuple[int, _Stream]] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def now(self) -> float:
        return anyio.current_time() - self.start

    async def call(self, job_id: str, call: PlannedCall) -> None:
        stream = _Stream(self.now())
        self.streams[job_id, call.node_id] = (len(call.prompt_ids), stream)
        request_id = f"{self.label}-{job_id}-{call.node_id}"
        decoder = CompletionDecoder(request_id, len(call.prompt_ids), call.max_tokens)
        body = request_body(call, request_id, self.model)
        try:
            async with self.http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise DirectCallFailed(f"{request_id}: {response.status_code} {response.text}")
                async for event in EventSource(response).aiter_sse():
                    decoder.feed(event.data)
                    self._streamed(len(call.prompt_ids), stream, decoder.counted)
            decoder.end()
        except BackendError as exc:
            raise DirectCallFailed(str(exc)) from exc
        self._streamed(len(call.prompt_ids), stream, decoder.counted)
        stream.finished = self.now()

    def _streamed(self, prompt_tokens: int, stream: _Stream, counted: int) -> None:
        """The call has streamed `counted` tokens by now."""
        seen = stream.tokens
        if counted <= seen:
            return
        stream.tokens = counted
        stream.deltas.append((self.now(), counted - seen))
        self.work += kv_token_time(prompt_tokens, counted) - kv_token_time(prompt_tokens, seen)
        if self.until_work is not None and self.work >= self.until_work:
            self.scope.cancel()

    async def job(self, planned: PlannedJob) -> None:
        await anyio.sleep_until(self.start + planned.job.arrival)
        done = {c.node_id: anyio.Event() for c in planned.calls}

        async def node(call: PlannedCall) -> None:
            for parent in call.parents:
                await done[parent].wait()
            await self.call(planned.job.job_id, call)
            done[call.node_id].set()

        async with anyio.create_task_group() as tg:
            for call in planned.calls:
                tg.start_soon(node, call)
        self.finished[planned.job.job_id] = self.now()


async def run_direct(
    http: httpx.AsyncClient,
    model: str,
    jobs: Sequence[PlannedJob],
    label: str = "direct",
    until_work: float | None = None,
) -> ArmRun:
    """Run `jobs` (arrival offsets in seconds) straight against the server at `http`'s URL."""
    run = _Run(http, model, label, anyio.current_time(), until_work)
    with run.scope:
        async with anyio.create_task_group() as tg:
            for job in jobs:
                tg.start_soon(run.job, job)
    records = {
        p.job.job_id: JobRecord(
            p.job.job_id, p.job.tenant, p.job.arrival, run.finished[p.job.job_id]
        )
        for p in jobs
        if p.job.job_id in run.finished
    }
    calls = [
        CallRecord(job_id, node_id, prompt, s.sent, tuple(s.deltas), s.finished)
        for (job_id, node_id), (prompt, s) in run.streams.items()
    ]
    wanted = {(p.job.job_id, c.node_id): c.max_tokens for p in jobs for c in p.calls}
    wrong = sum(
        c.finished is not None and c.output_tokens != wanted[c.job_id, c.node_id] for c in calls
    )
    return ArmRun(label, records, calls, wrong, run.now())


async def send_one(
    http: httpx.AsyncClient, model: str, call: PlannedCall, label: str
) -> CallRecord:
    """One call alone, straight to the server; its record's times are from when it was sent."""
    run = _Run(http, model, label, anyio.current_time(), None)
    await run.call(label, call)
    prompt, stream = run.streams[label, call.node_id]
    return CallRecord(
        label, call.node_id, prompt, stream.sent, tuple(stream.deltas), stream.finished
    )
