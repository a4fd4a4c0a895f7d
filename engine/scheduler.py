"""Continuous-batching scheduler: one StepPlan per model step, then `update` with its output.

Each step has a token budget. Running requests go first (a decode costs one token, an
unfinished prompt a chunk of it), in priority order; then waiting requests are admitted in
priority order while the budget, the sequence cap and the KV pool allow. Admission reserves KV
by `ReserveMode`: the known tokens only (vLLM), prompt + max_tokens (worst case), or prompt +
the predicted output length. A reservation is a promise, not an allocation: a request is
admitted only while the free blocks cover every running request's unallocated reservation plus
its own, and blocks are allocated as tokens arrive; a request that outgrows its reservation
extends lazily from whatever is free. When a
running request cannot get a block, the running request with the lowest priority (then the
newest) is preempted by recompute: its blocks are freed and it waits again with its output so
far. No request is ever skipped past: admission stops at the first one that does not fit.

Invariant: a request is in exactly one of `waiting`, `running`, or neither (finished), and
holds blocks only while running.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.block_manager import TOKEN_ID_LIMIT, BlockManager
from engine.config import EngineConfig, ReserveMode
from engine.errors import DuplicateRequest, InvalidRequest, RequestNotFound
from engine.plan import ScheduledSeq, StepOutput, StepPlan
from engine.request import FinishReason, Request, RequestStatus


@dataclass(slots=True)
class StepResult:
    new_tokens: dict[str, list[int]] = field(default_factory=dict)  # request id -> sampled
    finished: list[Request] = field(default_factory=list)
    hidden: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Capacity:
    free_blocks: int
    free_seqs: int
    num_running: int
    num_waiting: int
    used_blocks: int  # blocks holding KV now: the pool's usage, as a monitor reads it


class Scheduler:
    def __init__(
        self, config: EngineConfig, block_manager: BlockManager, eos_token_ids: frozenset[int]
    ) -> None:
        self.config = config
        self.blocks = block_manager
        self.eos_token_ids = eos_token_ids
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._preempted: list[str] = []
        self._freed: list[str] = []
        self.num_preemptions = 0

    def check(self, request: Request, *, replacing: bool = False) -> None:
        """Raise InvalidRequest when the request could never run here. `replacing`: the request
        of the same id is aborted first (its abort waits for the step in flight)."""
        if request.request_id in self.requests and not replacing:
            raise DuplicateRequest(f"duplicate request id {request.request_id!r}")
        limit = self.config.max_model_len
        if request.num_prompt_tokens == 0:
            raise InvalidRequest("empty prompt")
        if min(request.prompt_token_ids) < 0 or max(request.prompt_token_ids) >= TOKEN_ID_LIMIT:
            raise InvalidRequest(f"prompt token ids must be in [0, {TOKEN_ID_LIMIT})")
        if request.num_prompt_tokens + request.params.max_tokens > limit:
            raise InvalidRequest(
                f"prompt ({request.num_prompt_tokens}) + max_tokens "
                f"({request.params.max_tokens}) exceeds max_model_len {limit}"
            )
        if self.blocks.blocks_for(request.num_prompt_tokens + 1) > self.blocks.num_blocks:
            raise InvalidRequest("prompt does not fit in the whole KV pool")

    def add(self, request: Request) -> None:
        self.check(request)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request:
        request = self.requests.get(request_id)
        if request is None:
            raise RequestNotFound(request_id)
        self._finish(request, FinishReason.ABORT)
        return request

    def set_priority(self, request_id: str, priority: float) -> None:
        request = self.requests.get(request_id)
        if request is None:
            raise RequestNotFound(request_id)
        request.priority = priority

    def set_prediction(self, request_id: str, predicted_output_len: int) -> None:
        """A refined output prediction: what admission reserves for it, and for a running
        request in `PREDICTED` mode its reservation now (lowered: the blocks go back to the
        pool's headroom; raised: admission holds them back from later requests)."""
        request = self.requests.get(request_id)
        if request is None:
            raise RequestNotFound(request_id)
        check_prediction(predicted_output_len)
        request.predicted_output_len = predicted_output_len
        if request.status is RequestStatus.RUNNING and (
            self.config.reserve_mode is ReserveMode.PREDICTED
        ):
            request.reserved_tokens = self._admission_tokens(request, request.num_computed_tokens)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def capacity(self) -> Capacity:
        """KV blocks and sequence slots left once every waiting request is admitted, a new one
        with its predicted output (what a gateway dispatching by room must count: a burst of
        requests between two steps cannot be promised the same blocks twice)."""
        waiting_blocks = sum(self.blocks.blocks_for(self.waiting_tokens(r)) for r in self.waiting)
        promised = waiting_blocks + self._outstanding_blocks()
        return Capacity(
            free_blocks=self.blocks.num_free_blocks - promised,
            free_seqs=self.config.max_num_seqs - len(self.running) - len(self.waiting),
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            used_blocks=self.blocks.num_used_blocks,
        )

    @staticmethod
    def waiting_tokens(request: Request) -> int:
        """KV a waiting request will take: its tokens, plus its predicted output if it was never
        admitted (a preempted one resumes from what it has)."""
        if request.status is not RequestStatus.WAITING:
            return request.num_tokens
        predicted = min(request.predicted_output_len or 0, request.params.max_tokens)
        return request.num_tokens + predicted

    def schedule(self) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        seqs: list[ScheduledSeq] = []
        self.running.sort(key=lambda r: r.sort_key)
        for request in list(self.running):
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self._grow(request, request.num_computed_tokens + num_new):
                continue  # it was the victim itself
            seqs.append(self._seq(request, num_new))
            budget -= num_new
        if not self._preempted:  # re-admitting a victim in the same step would thrash
            budget = self._admit(seqs, budget)
        plan = StepPlan(
            seqs=seqs,
            num_batched_tokens=self.config.max_num_batched_tokens - budget,
            preempted_ids=self._preempted,
            freed_ids=self._freed,
        )
        self._preempted, self._freed = [], []
        return plan

    def update(self, plan: StepPlan, output: StepOutput, now: float) -> StepResult:
        result = StepResult(hidden=dict(output.hidden))
        for seq in plan.seqs:
            request = self.requests.get(seq.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            request.num_computed_tokens += len(seq.token_ids)
            if not seq.sample:
                self.blocks.cache_full_blocks(request)
                continue
            token = output.sampled[seq.request_id]
            request.output_token_ids.append(token)
            if request.first_token_time is None:
                request.first_token_time = now
            request.token_times.append(now)
            result.new_tokens[request.request_id] = [token]
            self.blocks.cache_full_blocks(request)
            reason = self._stop_reason(request, token)
            if reason is not None:
                request.finish_time = now
                self._finish(request, reason)
                result.finished.append(request)
        return result

    def finish(self, request_id: str, reason: FinishReason, now: float) -> Request:
        """End a request from outside (a stop string seen by the detokenizer)."""
        request = self.requests.get(request_id)
        if request is None:
            raise RequestNotFound(request_id)
        request.finish_time = now
        self._finish(request, reason)
        return request

    def _stop_reason(self, request: Request, token: int) -> FinishReason | None:
        params = request.params
        may_stop = request.num_output_tokens >= params.min_tokens
        if may_stop and not params.ignore_eos and token in self.eos_token_ids:
            return FinishReason.STOP
        if may_stop and token in params.stop_token_ids:
            return FinishReason.STOP
        if request.num_output_tokens >= params.max_tokens:
            return FinishReason.LENGTH
        return None

    def _admit(self, seqs: list[ScheduledSeq], budget: int) -> int:
        self.waiting.sort(key=lambda r: r.sort_key)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            cached = self.blocks.find_cached_prefix(request)
            num_cached = len(cached) * self.blocks.block_size
            num_new = min(request.num_tokens - num_cached, budget)
            reserve = self._admission_tokens(request, num_cached + num_new)
            headroom = self.blocks.num_free_blocks - self._outstanding_blocks()
            if self.blocks.blocks_for(reserve) - len(cached) > headroom:
                break
            if not self.blocks.allocate_slots(request, num_cached + num_new, cached):
                break
            request.reserved_tokens = reserve
            self.waiting.pop(0)
            if request.status is RequestStatus.PREEMPTED:
                request.num_recomputed_tokens += request.num_tokens - num_cached
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached
            request.num_cached_tokens = num_cached
            self.running.append(request)
            seqs.append(self._seq(request, num_new))
            budget -= num_new
        return budget

    def _outstanding_blocks(self) -> int:
        """Blocks promised to running requests' reservations but not yet allocated."""
        return sum(
            max(self.blocks.blocks_for(r.reserved_tokens) - len(r.block_ids), 0)
            for r in self.running
        )

    def _admission_tokens(self, request: Request, scheduled_end: int) -> int:
        """Tokens of KV to set aside at admission, by reservation mode."""
        mode = self.config.reserve_mode
        params = request.params
        if mode is ReserveMode.NONE:
            return scheduled_end
        if mode is ReserveMode.MAX:
            future = params.max_tokens - request.num_output_tokens
        else:
            predicted = request.predicted_output_len or 0
            future = min(params.max_tokens, predicted) - request.num_output_tokens
        return max(scheduled_end, request.num_tokens + max(future, 0))

    def _grow(self, request: Request, num_tokens: int) -> bool:
        """Extend a running request's blocks, preempting others (or itself) until it fits."""
        while not self.blocks.allocate_slots(request, num_tokens):
            victim = max(self.running, key=lambda r: (r.priority, r.arrival_time, r.request_id))
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.blocks.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(request)
        self._preempted.append(request.request_id)

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is not RequestStatus.FINISHED:
            self.waiting.remove(request)
        self.blocks.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        self._freed.append(request.request_id)

    def _seq(self, request: Request, num_new: int) -> ScheduledSeq:
        start = request.num_computed_tokens
        end = start + num_new
        return ScheduledSeq(
            request_id=request.request_id,
            token_ids=request.token_slice(start, end),
            start_pos=start,
            block_ids=list(request.block_ids),
            sample=end == request.num_tokens,
            params=request.params,
            num_output_tokens=request.num_output_tokens,
            want_hidden=request.params.return_hidden and request.num_output_tokens == 0,
        )


def check_prediction(predicted_output_len: int) -> None:
    """Raise InvalidRequest for a prediction no request can have."""
    if predicted_output_len < 0:
        raise InvalidRequest(f"predicted_output_len must be >= 0, got {predicted_output_len}")
