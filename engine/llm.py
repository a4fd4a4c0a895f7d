"""The synchronous engine core: scheduler + runner + detokenizers, one `step()` at a time.

`step()` asks the scheduler for a plan, has the runner execute it, applies the output, and
returns what each advanced request gained. A runner that raises fails that step's requests only:
each is finished with `FinishReason.ERROR` (its blocks freed, as an abort frees them) and gets a
final output, and every request outside the plan carries on at the next step. The clock is
injected: by default, wall time for a real runner and the runner's modelled time for the
simulated one. `generate()` is the offline entry point (benchmarks, labelling, tests).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import Detokenizer
from engine.errors import InvalidRequest, RequestNotFound
from engine.plan import StepOutput, StepPlan
from engine.request import FinishReason, Request
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler

logger = logging.getLogger(__name__)


class Runner(Protocol):
    eos_token_ids: frozenset[int]
    hidden_size: int  # length of the hidden vectors it hands out; 0: none
    vocab_size: int  # the token ids it has rows for (a tokenizer may know more)

    def execute(self, plan: StepPlan) -> StepOutput: ...


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str = ""
    finished: bool = False
    finish_reason: FinishReason | None = None
    hidden: list[float] | None = None
    request: Request | None = field(default=None, repr=False)  # set when finished


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        runner: Runner | None = None,
        tokenizer: Any = None,
        clock: Callable[[], float] | None = None,
        num_blocks: int | None = None,
    ) -> None:
        if runner is None:
            runner, tokenizer, num_blocks, config = _load_runner(config)
        elif num_blocks is None:
            num_blocks = config.num_blocks or 1024
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_cache)
        self.scheduler = Scheduler(config, self.block_manager, runner.eos_token_ids)
        self.virtual_time = 0.0
        self._clock = clock
        self._detok: dict[str, Detokenizer] = {}
        self._ids = itertools.count()
        self.last_step_s = 0.0
        self.last_step_failed = False  # the runner raised in the last step
        # the last step that ran, and its time (modelled, for a simulated runner): None after
        # a step with nothing to run or a failed one
        self.last_step: tuple[StepPlan, float] | None = None

    def now(self) -> float:
        return self._clock() if self._clock is not None else self.virtual_time

    def make_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        priority: float = 0.0,
        predicted_output_len: int | None = None,
        cache_salt: str = "",
        replacing: bool = False,
    ) -> Request:
        """Build and validate a request without touching the scheduler (safe mid-step);
        `replacing`: the request of the same id is aborted before this one is submitted."""
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        request = Request(
            request_id=rid,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            arrival_time=self.now(),
            priority=priority,
            predicted_output_len=predicted_output_len,
            cache_salt=cache_salt,
        )
        self.scheduler.check(request, replacing=replacing)
        # an id past the model's rows fails the step it is in, and so every request of it (on
        # CUDA, as a device-side assert); the runner's rows, not the tokenizer's, bound it
        if max(request.prompt_token_ids) >= self.runner.vocab_size:
            raise InvalidRequest(f"prompt token ids must be in [0, {self.runner.vocab_size})")
        return request

    def submit(self, request: Request, detokenize: bool = True) -> None:
        self.scheduler.add(request)
        wants_text = detokenize or bool(request.params.stop)
        if wants_text and self.tokenizer is not None:
            backend = self.tokenizer.backend_tokenizer
            params = request.params
            self._detok[request.request_id] = Detokenizer(
                backend, params.stop, params.min_tokens, request.prompt_token_ids
            )

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        priority: float = 0.0,
        predicted_output_len: int | None = None,
        cache_salt: str = "",
        detokenize: bool = True,
    ) -> str:
        request = self.make_request(
            prompt_token_ids,
            params,
            request_id=request_id,
            priority=priority,
            predicted_output_len=predicted_output_len,
            cache_salt=cache_salt,
        )
        self.submit(request, detokenize)
        return request.request_id

    def abort(self, request_id: str) -> Request:
        self._detok.pop(request_id, None)
        return self.scheduler.abort(request_id)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestOutput]:
        self.last_step_failed, self.last_step = False, None
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        start = time.perf_counter()
        try:
            output = self.runner.execute(plan)
        except Exception:
            logger.exception("model step failed; failing its %d requests", len(plan.seqs))
            self.last_step_failed = True
            return self._fail([seq.request_id for seq in plan.seqs])
        self.last_step_s = time.perf_counter() - start
        elapsed = output.elapsed_s or self.last_step_s
        self.virtual_time += elapsed
        self.last_step = (plan, elapsed)
        result = self.scheduler.update(plan, output, self.now())
        finished = {r.request_id: r for r in result.finished}
        outputs = []
        for rid, tokens in result.new_tokens.items():
            out = RequestOutput(rid, tokens, hidden=result.hidden.get(rid))
            self._detokenize(out, finished)
            if rid in finished:
                self._close(out, finished[rid])
            outputs.append(out)
        return outputs

    def fail_all(self) -> list[RequestOutput]:
        """Finish every request with ERROR: for a caller whose step failed in a way that leaves
        no request's progress trustworthy."""
        return self._fail(list(self.scheduler.requests))

    def _fail(self, request_ids: list[str]) -> list[RequestOutput]:
        now = self.now()
        outputs = []
        for rid in request_ids:
            out = RequestOutput(rid, [])
            self._close(out, self.scheduler.finish(rid, FinishReason.ERROR, now))
            outputs.append(out)
        return outputs

    def _close(self, out: RequestOutput, request: Request) -> None:
        """Make `out` the request's last output, with the text its detokenizer still held."""
        out.finished, out.request, out.finish_reason = True, request, request.finish_reason
        detok = self._detok.pop(out.request_id, None)
        if detok is not None and not detok.stopped:
            out.new_text += detok.flush()

    def _detokenize(self, out: RequestOutput, finished: dict[str, Request]) -> None:
        detok = self._detok.get(out.request_id)
        if detok is None:
            return
        for token in out.new_token_ids:
            out.new_text += detok.push(token)
        if not detok.stopped:
            return
        ended = finished.get(out.request_id)
        if ended is None:
            finished[out.request_id] = self.scheduler.finish(
                out.request_id, FinishReason.STOP, self.now()
            )
        elif ended.finish_reason is FinishReason.LENGTH:
            # its last allowed token completed a stop string: the text ends at the stop, and a
            # client reading "length" would ask for the rest (vLLM says "stop" too)
            ended.finish_reason = FinishReason.STOP

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Request]:
        """Run prompts to completion; returns the finished requests in prompt order."""
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        ids = [
            self.add_request(p, sp, detokenize=False) for p, sp in zip(prompts, plist, strict=True)
        ]
        done: dict[str, Request] = {}
        while self.has_unfinished:
            for out in self.step():
                if out.finished and out.request is not None:
                    done[out.request_id] = out.request
        return [done[i] for i in ids]

    def request(self, request_id: str) -> Request:
        found = self.scheduler.requests.get(request_id)
        if found is None:
            raise RequestNotFound(request_id)
        return found


def _load_runner(config: EngineConfig) -> tuple[Runner, Any, int, EngineConfig]:
    """The model's runner, its tokenizer, the KV blocks, and the config as the model and the
    pool bound it."""
    from engine.loader import load_tokenizer, resolve_model
    from engine.model_runner import ModelRunner

    path = resolve_model(config.model)
    num_blocks = config.num_blocks or ModelRunner.num_blocks_for(path, config)
    # a sequence past the model's positions would read outside its tables; one past the KV
    # pool could never run to its end, and would wait at the head of the queue for good
    longest = min(ModelRunner.positions(path), num_blocks * config.block_size)
    if config.max_model_len > longest:
        logger.warning("max_model_len %d: at most %d here", config.max_model_len, longest)
        config = dataclasses.replace(config, max_model_len=longest)
    return ModelRunner(path, config, num_blocks), load_tokenizer(path), num_blocks, config
