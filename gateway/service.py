"""The `fairgate.v1.Gateway` servicer: thin handlers that translate and delegate.

SubmitJob validates the DAG against the tenant's limits (before anything is rendered or
tokenized), admits it against the tenant's quotas and hands it to the dispatcher. The same
idempotency key returns the same job when the body is the same, and ALREADY_EXISTS when it is
not; only submissions with the same key wait for each other (one lock per tenant and key), so
no tenant's admission waits for another's. The gateway holds at most `max_active_jobs` jobs
(beyond: UNAVAILABLE, OVERLOADED). A tenant has at most `max_admissions_per_tenant` submissions
under way at once (beyond: RESOURCE_EXHAUSTED, QUOTA_ADMISSIONS): its admissions render and
encode one at a time, and more waiting would only hold the server's RPC slots, which every
tenant shares. Its admitted, unfinished jobs on this replica hold at most `max_queued_chars`
characters together (`job_chars`: inputs and prompts; beyond: RESOURCE_EXHAUSTED,
QUOTA_QUEUED_CHARS), counted before anything is rendered: a job of a few kilobytes can repeat a
large input into every node's prompt, and its ready calls hold their prompts' token ids (what
parents' outputs add is counted as each node is rendered: `Dispatcher._hold_outputs`).
Streams count against the tenant's `max_streams`. RunJob and Generate cancel a job they created
when the last client running it goes away; WatchJob only stops watching. A stream whose key is
revoked (or whose tenant is deleted) ends with UNAUTHENTICATED, and an admission under way when
that happens is undone.

With a journal (the redis store, docs/REPLICAS.md) a job is journaled before its submitter
hears of it, idempotency keys hold across replicas, and any replica answers GetJob, WatchJob and
CancelJob for any job of the caller's tenant: a job another replica runs is read (and watched)
from the journal, and its cancel goes to its owner through it. A replica that is handing its
jobs over (shutting down) never cancels a job because its stream ends: the client resumes with
WatchJob elsewhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import grpc
from cachetools import TTLCache
from opentelemetry import trace

from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.auth import current_key, current_tenant
from gateway.dispatch import Dispatcher
from gateway.errors import (
    IdempotencyConflict,
    JournalUnavailable,
    NotFound,
    Overloaded,
    Unauthenticated,
    grpc_edge,
)
from gateway.gateway_protos import (
    chat_from_proto,
    event_to_proto,
    finish_reason,
    generate_counts,
    job_counts,
    job_spec_from_proto,
    job_templates,
    job_to_proto,
    sampling_from_proto,
    usage,
)
from gateway.job_run import JobEnded, JobEvent, JobRun, NodeChanged, NodeState, TokensAdded
from gateway.jobs import (
    PLACEHOLDERS_PER_NODE,
    ChatMessage,
    FieldViolation,
    JobInvalid,
    JobLimits,
    JobSpec,
    NodeSpec,
    check_counts,
    check_node_count,
    check_templates,
    job_chars,
    validate_job,
)
from gateway.journal import KeyTaken, Owned
from gateway.journaling import Journaling
from gateway.keyed_locks import KeyedLocks
from gateway.loop_budget import LoopBudget
from gateway.overload import ShedJob
from gateway.registry import JobRegistry, check_job_id, new_job_id
from gateway.revocations import STAMP, Revocations
from gateway.spans import add_shed_event
from gateway.streams import OpenStreams, Stream
from gateway.tenant_counts import TenantCounts
from tenants import (
    QuotaExceeded,
    QuotaStore,
    QuotaUnavailable,
    TenantNotFound,
    TenantQuota,
    refusals,
)

Context = grpc.aio.ServicerContext[Any, Any]
MAX_ACTIVE_JOBS = 10_000
MAX_ADMISSIONS_PER_TENANT = 256  # a sixteenth of the default max_concurrent_rpcs
READ_BLOCK_S = 0.5  # a watch of a job another replica runs checks its stream this often
READ_PAGE = 512  # events a watch reads from the journal at once (between them the loop runs)

log = logging.getLogger(__name__)


def limits_for(
    quota: TenantQuota, max_prompt_chars: int, models: frozenset[str] = frozenset()
) -> JobLimits:
    max_nodes = quota.max_nodes_per_job or JobLimits().max_nodes
    return JobLimits(
        max_nodes=max_nodes,
        max_placeholders=PLACEHOLDERS_PER_NODE * max_nodes,
        max_tokens_ceiling=quota.max_tokens_ceiling,
        max_prompt_chars=max_prompt_chars,
        models=models,
    )


class GatewayService(gateway_pb2_grpc.GatewayServicer):
    def __init__(
        self,
        jobs: JobRegistry,
        dispatcher: Dispatcher,
        store: QuotaStore,
        streams: OpenStreams,
        clock: Callable[[], float] = time.time,
        quota_ttl_s: float = 1.0,
        max_active_jobs: int = MAX_ACTIVE_JOBS,
        max_admissions_per_tenant: int = MAX_ADMISSIONS_PER_TENANT,
        *,
        revocations: Revocations,
        loop_budget: LoopBudget,
        journaling: Journaling | None = None,
    ) -> None:
        self.jobs = jobs
        self.journaling = journaling
        self.handing_over = False  # shutting down: jobs go on elsewhere, streams end
        self.dispatcher = dispatcher
        self.store = store
        self.streams = streams
        self.clock = clock
        self.max_active_jobs = max_active_jobs
        self.max_admissions_per_tenant = max_admissions_per_tenant
        self._admitting = TenantCounts()  # per tenant, submissions under way
        # per tenant, the characters of its jobs being admitted (the dispatcher counts the rest)
        self._admitting_chars = TenantCounts()
        self._key_locks = KeyedLocks()  # idempotency keys: check-and-add is one step
        # a tenant's reads of jobs another replica runs, one at a time: each takes the loop for
        # up to tens of ms, and one tenant's many must not queue ahead of every other tenant
        self._reading = KeyedLocks()
        self._running: Counter[str] = Counter()  # job id -> RunJob/Generate streams running it
        # so that an admission under way across a key's revocation or its tenant's deletion is
        # undone instead of escaping the cancel
        self.revocations = revocations  # the auth interceptor's
        # each tenant's share of the loop for its requests' work before admission, the
        # interceptor's, which charges their parsing to it too
        self.loop_budget = loop_budget
        # tenant -> quota: an operator's change reaches new jobs within quota_ttl_s
        self._quotas: TTLCache[str, TenantQuota] = TTLCache(maxsize=65_536, ttl=quota_ttl_s)

    async def submit(
        self, tenant_id: str, spec: JobSpec, fingerprint: str = "", *, streamed: bool = False
    ) -> JobRun:
        """The job for this spec: a new one, or the one its idempotency key already names.
        `streamed`: the caller is a RunJob or Generate, which owns a job it creates."""
        limit = self.max_admissions_per_tenant
        # waiting for a key's lock counts too
        try:
            with self._admitting.holding(tenant_id, limit, refusals.admissions):
                return await self._submit(tenant_id, spec, fingerprint, streamed)
        except Overloaded as refusal:  # whichever part of the gateway had no room for it
            span = trace.get_current_span()
            add_shed_event(span, refusal.reason, retry_after_s=refusal.retry_after_s)
            raise

    async def _submit(
        self, tenant_id: str, spec: JobSpec, fingerprint: str, streamed: bool
    ) -> JobRun:
        if not spec.idempotency_key:
            return await self._admit(tenant_id, spec, fingerprint, streamed)
        async with self._key_locks.hold((tenant_id, spec.idempotency_key)):
            existing = self.jobs.by_key(tenant_id, spec.idempotency_key)
            if existing is not None and existing.detached:  # taken over: the journal answers
                existing = None
            if existing is None and self.journaling is not None:
                job_id = await self.journaling.journal.job_by_key(tenant_id, spec.idempotency_key)
                existing = await self._find(tenant_id, job_id) if job_id is not None else None
            if existing is None:
                try:
                    return await self._admit(tenant_id, spec, fingerprint, streamed)
                except KeyTaken as taken:  # another replica's submission with the key won
                    existing = await self._find(tenant_id, taken.job_id)
            if existing.fingerprint != fingerprint:
                raise IdempotencyConflict(
                    f"idempotency key {spec.idempotency_key!r} was used for another job "
                    f"({existing.job_id})"
                )
            return existing

    async def _admit(
        self, tenant_id: str, spec: JobSpec, fingerprint: str, streamed: bool
    ) -> JobRun:
        key_id = current_key()
        quota = await self._quota(tenant_id)
        with self.loop_budget.spending(tenant_id):
            chars = validate_job(spec, self._limits(quota), now=self.clock())
        if len(self.dispatcher.runs) >= self.max_active_jobs:
            raise Overloaded(f"the gateway holds {self.max_active_jobs} active jobs; retry later")
        # the store decides, after the job is rendered and encoded; a tenant this replica alone
        # shows at its limit is refused before that work (it never counts more than the store)
        active = self.dispatcher.active_jobs(tenant_id)
        if 0 < quota.max_queued_jobs <= active:
            raise refusals.queued_jobs(tenant_id, quota.max_queued_jobs, active)
        run = JobRun(new_job_id(), tenant_id, spec, self.clock())
        run.key_id, run.fingerprint, run.streamed = key_id, fingerprint, streamed
        run.chars = chars
        held = self.dispatcher.held_chars(tenant_id) + self._admitting_chars[tenant_id]
        limit = self.dispatcher.config.max_queued_chars
        if 0 < limit < held + run.chars:
            raise refusals.queued_chars(tenant_id, limit, held, run.chars)
        self.dispatcher.refuse_if_down(run)
        with self._admitting_chars.adding(tenant_id, run.chars):
            async with self._slots(run, quota.weight):
                return await self._admit_run(run, quota, key_id)

    @asynccontextmanager
    async def _slots(self, run: JobRun, weight: float) -> AsyncIterator[None]:
        """Under overload control, the job is refused (SLO_SHED) or holds the slots its first
        calls want until it is submitted."""
        overload = self.dispatcher.overload
        if overload is None:
            yield
            return
        needs = Counter(self.dispatcher.intake.lane_of(run, n).model for n in run.dag.roots())
        try:
            sheddable, tenant = run.spec.sheddable, run.tenant_id
            with overload.admission(needs, sheddable, tenant=tenant, weight=weight):
                yield
        except ShedJob:
            if self.dispatcher.metrics is not None:
                self.dispatcher.metrics.shed(run.tenant_id)
            message = "the gateway misses its latency targets: new jobs are refused; retry later"
            retry = overload.monitor.config.hold_s
            raise Overloaded(message, retry, reason="SLO_SHED") from None

    async def _admit_run(self, run: JobRun, quota: TenantQuota, key_id: str) -> JobRun:
        tenant_id = run.tenant_id
        admitted = await self.dispatcher.admit(run, quota)
        if self.journaling is not None:  # journaled before anyone hears of it
            journal = self.journaling.journal
            sent = self.journaling.clock()  # its lease starts no earlier
            try:
                owned = await journal.create(run)
            except KeyTaken:
                await self.dispatcher.undo_admit(run, admitted)
                raise
            except BaseException:
                # the job may be journaled (its reply lost, or its client gone), and its client
                # told it is not: whoever claims it cancels it, and its key is free for a retry
                with anyio.CancelScope(shield=True):
                    await self.dispatcher.undo_admit(run, admitted)
                    try:
                        await journal.abandon(run)
                    except JournalUnavailable:
                        log.warning("job %s may run though refused: journal away", run.job_id)
                raise
            await self.journaling.attach_created(owned, run, sent)
        self.jobs.add(run)
        self.dispatcher.submit(run, quota, admitted)
        withdrawn = self.revocations.since(STAMP.get(), tenant_id, key_id)
        if withdrawn:
            self.dispatcher.cancel(run, "API key revoked", charge=True)
            if withdrawn == "tenant":
                self.jobs.forget_tenant(tenant_id)  # a tenant made again under the id starts clean
            raise Unauthenticated("the API key was revoked")
        return run

    async def take_over(self, owned: Owned, run: JobRun, cancel_asked: bool) -> None:
        """Run on a job whose replica died or handed it back (claimed from the journal and
        journaled from then on)."""
        assert self.journaling is not None
        self.jobs.add(run, keyed=False)  # a submission with its key asks the journal
        # counted as held, never refused: a claimed job runs here or is handed on
        run.chars = job_chars(run.spec)
        try:
            quota = await self._quota(run.tenant_id)
            await self.dispatcher.resume(run, quota)
        except (TenantNotFound, QuotaExceeded) as exc:
            # a count that frees as the tenant's jobs end (its admission lapsed with its last
            # owner, and newer jobs took the slots): accepted, the job waits for a later claim
            frees = isinstance(exc, QuotaExceeded) and exc.retry_after_s is not None
            if frees and not cancel_asked:
                await self._give_back(run, str(exc), at_once=False)
                return
            run.cancel(self.clock(), f"could not resume: {exc}")  # it cannot run anywhere
            self.jobs.ended(run)
            return
        except QuotaUnavailable:  # it cannot run here now: the next claim tries again
            await self._give_back(run, "the quota store is away")
            return
        except Exception:  # it would fail the same way on any replica
            log.exception("taking over job %s failed", run.job_id)
            self.dispatcher.cancel(run, "could not resume: internal error", failed=True)
            self.jobs.ended(run)  # the dispatcher may not have held it yet
            return
        if cancel_asked:
            self.dispatcher.cancel(run, "cancelled by the client", charge=True)
        if run.ended:  # perhaps before the dispatcher held it (cancelled, or lost, meanwhile)
            self.jobs.ended(run)

    async def _give_back(self, run: JobRun, why: str, *, at_once: bool = True) -> None:
        """A job taken over that cannot run here now goes back to the journal for a later
        claim (here or on another replica; `Journaling.give_back`)."""
        assert self.journaling is not None
        log.warning("taking over job %s: %s; given back", run.job_id, why)
        await self.journaling.give_back(run.job_id, at_once=at_once)
        self.jobs.discard(run)

    async def _find(self, tenant_id: str, job_id: str) -> JobRun:
        """The caller's job: the one this replica runs, else as the journal has it."""
        check_job_id(job_id)
        try:
            run = self.jobs.get(tenant_id, job_id)
        except NotFound:
            if self.journaling is None:
                raise
        else:
            if not run.detached:  # only a journaled job is ever detached
                return run
        loaded = await self._view(tenant_id, job_id)
        if loaded is None:
            raise NotFound(f"job {job_id!r} not found")
        return loaded

    async def _view(self, tenant_id: str, job_id: str) -> JobRun | None:
        """The job as the journal has it, read in the tenant's turn."""
        assert self.journaling is not None
        async with self._reading.hold(tenant_id):
            return await self.journaling.journal.load(tenant_id, job_id)

    async def _follow(
        self, run: JobRun, after: int, stop: Callable[[], bool]
    ) -> AsyncIterator[tuple[JobRun, list[JobEvent]]]:
        """`_events`, ending with the job's end: a watcher that asked from past it (a sequence
        of another job's, say) is given it once the job has ended, as its last event, so that
        every stream that is not stopped ends with JobFinished, not in silence."""
        ended = False
        async for job, batch in self._events(run, after, stop):
            ended = isinstance(batch[-1].body, JobEnded)
            yield job, batch
        if ended or stop():
            return
        if not run.detached:  # its end, read from this replica's log once it is durable
            async for batch in run.watch_batches(run.last_sequence - 1, stop):
                yield run, batch
            return
        view = await self._view(run.tenant_id, run.job_id) if self.journaling else None
        if view is not None and view.ended and view.finished_at is not None:
            end = JobEvent(view.last_sequence, view.finished_at, JobEnded(view.state))
            yield view, [end]  # as it was journaled

    async def _events(
        self, run: JobRun, after: int, stop: Callable[[], bool]
    ) -> AsyncIterator[tuple[JobRun, list[JobEvent]]]:
        """The job's events after sequence `after`, each batch with the job as it is then (or
        later: a batch read from the journal for the watcher only): from this replica while it
        runs the job (the journal has those before its own log, when it took the job over from
        a snapshot), then from the journal (another replica runs it, or it was read from
        there), until it has ended or `stop()`."""
        seen = after
        with run.watching():  # from the start: the deltas after the history are kept for it
            async for events in self._history(run, seen, run.log_start, stop):
                seen = events[-1].sequence
                yield run, events
            async for batch in run.watch_batches(seen, stop):
                if batch:
                    seen = batch[-1].sequence
                    yield run, batch
        if not run.detached or self.journaling is None or stop():
            return
        journal = self.journaling.journal
        view = await self._view(run.tenant_id, run.job_id)
        if view is None:
            return
        async for events in self._history(view, seen, view.last_sequence, stop):
            seen = events[-1].sequence
            yield view, events
        # read on from the view's own place, not the watcher's: a watcher asking from past the
        # job's last event must still see it end (read from there, its end never came)
        while not view.ended and not stop():
            at = view.last_sequence
            events = await journal.read(run.tenant_id, run.job_id, at, READ_BLOCK_S, READ_PAGE)
            if not events:
                if not await journal.exists(run.tenant_id, run.job_id):
                    raise NotFound(f"job {run.job_id!r} is no longer kept")
                continue
            for event in events:
                view.replay(event)
            fresh = [event for event in events if event.sequence > seen]
            if fresh:
                seen = fresh[-1].sequence
                yield view, fresh

    async def _history(
        self, run: JobRun, after: int, until: int, stop: Callable[[], bool]
    ) -> AsyncIterator[list[JobEvent]]:
        """The journal's events after `after` up to `until`, a page at a time: a job restored
        from a snapshot, here or in a view, holds no event before it."""
        while self.journaling is not None and after < until and not stop():
            journal = self.journaling.journal
            page = await journal.read(run.tenant_id, run.job_id, after, None, READ_PAGE)
            events = [event for event in page if event.sequence <= until]
            if not events and not run.detached:
                return  # the journal dropped the job this replica still holds: its own log
            if not events:
                # dropped as its tenant's ended jobs passed their bounds: nothing more comes
                raise NotFound(f"job {run.job_id!r} is no longer kept")
            after = events[-1].sequence
            yield events

    async def _quota(self, tenant_id: str) -> TenantQuota:
        quota = self._quotas.get(tenant_id)
        if quota is None:
            quota = self._quotas[tenant_id] = (await self.store.get_tenant(tenant_id)).quota
        return quota

    def _limits(self, quota: TenantQuota) -> JobLimits:
        return limits_for(quota, self.dispatcher.config.max_prompt_chars, self.dispatcher.models)

    async def _spec(self, tenant_id: str, msg: pb.JobSpec) -> JobSpec:
        """The request's job, converted once its node count, then its other counts, then its
        templates' size are known to be within the tenant's limits, each bounding what the
        next reads (`check_node_count`, `check_counts`, `check_templates`)."""
        limits = self._limits(await self._quota(tenant_id))
        with self.loop_budget.spending(tenant_id):
            check_node_count(len(msg.nodes), limits)
            check_counts(job_counts(msg), limits)
            check_templates(job_templates(msg), limits)
            return job_spec_from_proto(msg)

    @grpc_edge
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Context) -> pb.Job:
        spec = await self._spec(current_tenant(), request.job)
        run = await self.submit(current_tenant(), spec, _fingerprint(request.job))
        return self._job(run)

    def _job(self, run: JobRun) -> pb.Job:
        """The job as its tenant's answer, charged to the tenant's share of the loop."""
        with self.loop_budget.charging(run.tenant_id):
            return job_to_proto(run)

    def _events_of(self, view: JobRun, batch: list[JobEvent]) -> list[pb.JobEvent]:
        """A batch of the job's events as its tenant's stream sends them, charged likewise."""
        with self.loop_budget.charging(view.tenant_id):
            return [event_to_proto(view, event) for event in batch]

    @grpc_edge
    async def GetJob(self, request: pb.GetJobRequest, context: Context) -> pb.Job:
        return self._job(await self._find(current_tenant(), request.job_id))

    @grpc_edge
    async def CancelJob(self, request: pb.CancelJobRequest, context: Context) -> pb.Job:
        run = await self._find(current_tenant(), request.job_id)
        if not run.ended:
            await self._cancel(run, "cancelled by the client")
        return self._job(run)

    async def _cancel(self, run: JobRun, reason: str) -> None:
        """Cancel here when this replica runs the job, else ask its owner through the journal."""
        if not run.detached:
            self.dispatcher.cancel(run, reason, charge=True)
        elif self.journaling is not None:
            await self.journaling.journal.ask_cancel(run.tenant_id, run.job_id)

    @grpc_edge
    async def WatchJob(
        self, request: pb.WatchJobRequest, context: Context
    ) -> AsyncIterator[pb.JobEvent]:
        async with self._stream() as stream:
            run = await self._find(current_tenant(), request.job_id)
            stream.watch(run)
            # from_sequence names the first event wanted; _follow takes the last one seen
            after = max(request.from_sequence - 1, 0)
            async for view, batch in self._follow(run, after, stream.is_closed):
                for message in self._events_of(view, batch):
                    yield message

    @grpc_edge
    async def RunJob(
        self, request: pb.SubmitJobRequest, context: Context
    ) -> AsyncIterator[pb.JobEvent]:
        async with self._stream() as stream:
            spec = await self._spec(current_tenant(), request.job)
            fingerprint = _fingerprint(request.job)
            run = await self.submit(current_tenant(), spec, fingerprint, streamed=True)
            stream.watch(run)
            async with self._running_by_client(run):
                async for view, batch in self._follow(run, 0, stream.is_closed):
                    for message in self._events_of(view, batch):
                        yield message

    @grpc_edge
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        async with self._stream() as stream:
            tenant = current_tenant()
            try:
                check_counts(generate_counts(request), self._limits(await self._quota(tenant)))
                run = await self.submit(tenant, _single_call(request), streamed=True)
            except JobInvalid as exc:  # told in the request's terms, not its one-node job's
                kind = request.WhichOneof("input") or "prompt"
                raise JobInvalid(
                    [
                        FieldViolation(_generate_field(v.field, kind), v.description)
                        for v in exc.violations
                    ]
                ) from None
            stream.watch(run)
            async with self._running_by_client(run):
                # One response per wake-up: the tokens that came meanwhile, with the end if so
                async for view, batch in self._follow(run, 0, stream.is_closed):
                    with self.loop_budget.charging(tenant):
                        response = _generate_response(view, batch)
                    if (
                        response.token_ids
                        or response.text
                        or response.restarted
                        or response.HasField("usage")
                    ):
                        yield response

    @asynccontextmanager
    async def _stream(self) -> AsyncIterator[Stream]:
        """An open stream of the caller's; one closed from outside ends UNAUTHENTICATED."""
        tenant, key_id = current_tenant(), current_key()
        quota = await self._quota(tenant)
        with self.streams.open(tenant, key_id, quota.max_streams) as stream:
            # a revocation while the quota was read closed the streams open then, not this one
            if self.revocations.since(STAMP.get(), tenant, key_id):
                raise Unauthenticated("the API key was revoked")
            yield stream
            if stream.closed:
                raise Unauthenticated(stream.closed)

    @asynccontextmanager
    async def _running_by_client(self, run: JobRun) -> AsyncIterator[None]:
        """A job a RunJob or Generate created is cancelled when the last client stream running
        it goes away early; a job SubmitJob created is not (its streams only watch it)."""
        self._running[run.job_id] += 1
        try:
            yield
        finally:
            self._running[run.job_id] -= 1
            if not self._running[run.job_id]:
                del self._running[run.job_id]
                # a job another replica took over has ended here (its copy was cancelled),
                # not there: its owner is asked through the journal
                if run.streamed and (run.detached or not run.ended) and not self.handing_over:
                    with anyio.CancelScope(shield=True):
                        try:
                            await self._cancel(run, "client disconnected")
                        except JournalUnavailable:  # the stream's end is no error of it
                            log.warning("could not ask for job %s's cancel", run.job_id)


def _generate_response(run: JobRun, batch: list[Any]) -> pb.GenerateResponse:
    response = pb.GenerateResponse()
    for event in batch:
        if isinstance(event.body, TokensAdded):
            response.text += event.body.text
            response.token_ids.extend(event.body.token_ids)
        elif isinstance(event.body, NodeChanged) and event.body.previous is NodeState.RUNNING:
            if event.body.state is NodeState.READY:  # run again from its prompt: start over
                response.restarted = True
                response.text = ""
                del response.token_ids[:]
        elif isinstance(event.body, JobEnded):
            node = run.nodes["generate"]
            response.finish_reason = finish_reason(node)
            response.usage.CopyFrom(usage([node]))
            if node.state is not NodeState.SUCCEEDED:
                response.reason = node.reason
    return response


def _fingerprint(job: pb.JobSpec) -> str:
    """A digest of the submitted job (deterministic: map entries sorted)."""
    return hashlib.sha256(job.SerializeToString(deterministic=True)).hexdigest()


_MESSAGE_INPUT = re.compile(r'inputs\["m(\d+)"\]')


def _generate_field(field: str, kind: str) -> str:
    """A violation's path in the one-node job `_single_call` makes -> the request's field
    (`kind`: its input, "prompt" or "chat")."""
    if field == 'inputs["prompt"]' or field == "nodes[0]":
        return kind
    if message := _MESSAGE_INPUT.fullmatch(field):
        return f"chat.messages[{message[1]}].content"
    return field.removeprefix("nodes[0].")


def _single_call(request: pb.GenerateRequest) -> JobSpec:
    """A one-node job for Generate; its text travels as inputs, so it stays literal (plain
    text, no templates, as the proto says)."""
    sampling = sampling_from_proto(request.sampling)
    call = NodeSpec(id="generate", sampling=sampling, name=request.name, model=request.model)
    if request.WhichOneof("input") == "chat":
        given = chat_from_proto(request.chat)
        inputs = {f"m{i}": m.content for i, m in enumerate(given)}
        messages = tuple(ChatMessage(m.role, f"{{{{inputs.m{i}}}}}") for i, m in enumerate(given))
        node = dataclasses.replace(call, messages=messages)
        return JobSpec(nodes=(node,), inputs=inputs, name="generate")
    node = dataclasses.replace(call, prompt_template="{{inputs.prompt}}")
    return JobSpec(nodes=(node,), inputs={"prompt": request.prompt}, name="generate")
