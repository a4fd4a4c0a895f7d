"""The async client of the fairgate Gateway: submit, watch, run, get and cancel jobs; generate.

Usage:

    async with Client("127.0.0.1:50051", api_key) as client:
        async for event in client.run_job(map_reduce({"a": text_a, "b": text_b})):
            if isinstance(event, JobFinished):
                print(event.job.outputs["reduce"])

Results are typed (`fairgate.results`); failures raise `fairgate.errors.FairgateError`
subclasses with the server's details. Streams are async generators: leaving the loop early
and closing the generator (`contextlib.aclosing`) cancels the RPC at once — for `run_job` and
`generate` that also cancels the job on the server.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from contextlib import aclosing
from functools import cached_property

from fairgate.builder import sampling_spec
from fairgate.connection import Connection
from fairgate.results import (
    FinishReason,
    GenerateFinished,
    Job,
    JobEvent,
    TextDelta,
    enum_from_proto,
    event_from_proto,
    job_from_proto,
    usage_from_proto,
)
from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc


class Client(Connection):
    """A tenant's connection to the Gateway service: `Client(target, api_key)`."""

    @cached_property
    def _gateway(self) -> gateway_pb2_grpc.GatewayStub:
        return gateway_pb2_grpc.GatewayStub(self.channel)

    async def submit_job(self, spec: pb.JobSpec) -> Job:
        """Validate and queue a job; the same idempotency key returns the first job."""
        response = await self.unary(self._gateway.SubmitJob, pb.SubmitJobRequest(job=spec))
        return job_from_proto(response)

    async def get_job(self, job_id: str) -> Job:
        request = pb.GetJobRequest(job_id=job_id)
        return job_from_proto(await self.unary(self._gateway.GetJob, request))

    async def cancel_job(self, job_id: str) -> Job:
        """Abort the job's running calls; a finished job comes back unchanged."""
        request = pb.CancelJobRequest(job_id=job_id)
        return job_from_proto(await self.unary(self._gateway.CancelJob, request))

    async def watch_job(
        self, job_id: str, from_sequence: int = 0
    ) -> AsyncGenerator[JobEvent, None]:
        """Events with sequence >= from_sequence, then live ones, ending with JobFinished."""
        request = pb.WatchJobRequest(job_id=job_id, from_sequence=from_sequence)
        # closed with this generator, not later by the loop's finalizer: the RPC ends at once
        async with aclosing(self.stream(self._gateway.WatchJob, request)) as messages:
            async for message in messages:
                if (event := event_from_proto(message)) is not None:
                    yield event

    async def run_job(self, spec: pb.JobSpec) -> AsyncGenerator[JobEvent, None]:
        """Submit and watch in one stream; closing it before JobFinished cancels the job."""
        request = pb.SubmitJobRequest(job=spec)
        async with aclosing(self.stream(self._gateway.RunJob, request)) as messages:
            async for message in messages:
                if (event := event_from_proto(message)) is not None:
                    yield event

    async def generate(
        self,
        prompt: str | Iterable[tuple[str, str]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        stop: str | Iterable[str] = (),
        seed: int | None = None,
        name: str = "",
        model: str = "",
    ) -> AsyncGenerator[TextDelta | GenerateFinished, None]:
        """One call: TextDelta items as text arrives, then GenerateFinished with the whole text.

        `prompt` is plain text, or chat messages as `(role, content)` pairs; `model` empty:
        the gateway's default model.
        """
        sampling = sampling_spec(max_tokens, temperature, top_p, top_k, stop, seed)
        request = pb.GenerateRequest(sampling=sampling, name=name, model=model)
        if isinstance(prompt, str):
            request.prompt = prompt
        else:
            messages = [pb.ChatMessage(role=role, content=text) for role, text in prompt]
            request.chat.CopyFrom(pb.ChatPrompt(messages=messages))
        parts: list[str] = []
        async with aclosing(self.stream(self._gateway.Generate, request)) as responses:
            async for message in responses:
                if message.restarted:
                    parts.clear()
                if message.text or message.token_ids or message.restarted:
                    parts.append(message.text)
                    yield TextDelta(message.text, tuple(message.token_ids), message.restarted)
                if message.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                    reason = enum_from_proto(FinishReason, message.finish_reason)
                    usage = usage_from_proto(message.usage)
                    yield GenerateFinished("".join(parts), reason, usage, message.reason)
