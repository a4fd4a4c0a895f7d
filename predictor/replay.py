"""Replay of the engine's continuous batching on a step-time model, for latency estimates.

Every step, each decoding call advances one token and the rest of the token budget prefills
queued calls in order (chunked; a call's first token comes with its last prompt chunk),
admitting a new call only while fewer than `max_num_seqs` run; a step costs
`StepTimeModel.step_time` of its batched tokens, context tokens and prefill chunks' attention
pairs, as the engine's steps are measured (`StepShape`). Stretches without prefill are summed in
closed form up to the next finish or the next expected arrival (context grows by one token per
decoding call per step), so a replay costs O(prefill steps + calls log calls). Expected
arrivals (`ArrivalLoad`), evenly spaced and of mean size, join the queue's end as time passes:
they never get ahead of a real call but make its steps slower, as future traffic does. The
replay stops when every real queued call has finished. It assumes KV never runs out and no
prefix-cache hits (a cached prefix would be prefilled, and charged, from position 0).
Invariant: a decoding call's context at step s is `offset + s`, and `offset_sum` is the sum of
the offsets of the calls decoding now.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine import StepTimeModel, prefill_pairs


@dataclass(frozen=True, slots=True)
class QueuedCall:
    prompt_tokens: int  # tokens to prefill (after a preemption: prompt + output so far)
    output_tokens: int  # tokens still to generate (predicted), >= 1
    prefilled: int = 0  # tokens of it already computed (a running call mid-prefill)


@dataclass(frozen=True, slots=True)
class DecodingCall:
    num_tokens: int  # prompt + output so far
    remaining_output: int  # tokens still to generate (predicted), >= 1


@dataclass(frozen=True, slots=True)
class EngineState:
    decoding: Sequence[DecodingCall] = ()
    queue: Sequence[QueuedCall] = ()  # mid-prefill running calls first, then waiting, in order


@dataclass(frozen=True, slots=True)
class ArrivalLoad:
    """Traffic expected from now on: one call of this size every `gap_s` seconds."""

    gap_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Estimate:
    ttft_s: float  # from now until the first output token
    completion_s: float  # from now until the last output token


class Replay:
    def __init__(
        self,
        step_model: StepTimeModel,
        token_budget: int,
        max_num_seqs: int,
        state: EngineState,
        load: ArrivalLoad | None = None,
    ) -> None:
        self.m = step_model
        self.budget, self.max_seqs = token_budget, max_num_seqs
        self.step, self.time = 0, 0.0
        self.finishes: list[tuple[int, int, int]] = []  # (last step, offset, queue index or -1)
        self.offset_sum = 0
        for d in state.decoding:
            self._join(d.num_tokens, d.remaining_output, -1)
        self.queue = list(state.queue)
        self.done = [q.prefilled for q in self.queue]
        self.head = 0
        self.num_real = self.real_left = len(self.queue)
        self.ttft = [0.0] * len(self.queue)
        self.completion = [0.0] * len(self.queue)
        self.load = load
        self.next_arrival = load.gap_s if load is not None else math.inf
        self.pending = 0  # expected arrivals due but not yet in `queue` (see `_arrive`)

    def run(self) -> list[Estimate]:
        while self.real_left:
            self._arrive()
            if self.head < len(self.queue) and len(self.finishes) < self.max_seqs:
                self._prefill_step()
            else:
                self._decode_stretch()
        real = zip(self.ttft[: self.num_real], self.completion[: self.num_real], strict=True)
        return [Estimate(t, c) for t, c in real]

    def _arrive(self) -> None:
        """Expected arrivals due by now join the queue's end. A step admits at most `max_seqs`
        waiting calls, so only that many are put in the queue and the rest wait as a count
        (they are all alike and in order): a gap far shorter than a step, as a burst of
        arrivals gives, costs no more than a long one."""
        load = self.load
        if load is not None and self.next_arrival <= self.time:
            due = math.floor((self.time - self.next_arrival) / load.gap_s) + 1
            self.pending += due
            self.next_arrival += due * load.gap_s
        while self.pending and len(self.queue) - self.head < self.max_seqs:
            assert load is not None, "only expected arrivals are pending"
            self.queue.append(QueuedCall(load.prompt_tokens, load.output_tokens))
            self.done.append(0)
            self.ttft.append(0.0)
            self.completion.append(0.0)
            self.pending -= 1

    def _join(self, num_tokens: int, remaining: int, index: int) -> None:
        """A call whose next decode is at `self.step` with `num_tokens` tokens of context."""
        offset = num_tokens - self.step
        heapq.heappush(self.finishes, (self.step + remaining - 1, offset, index))
        self.offset_sum += offset

    def _prefill_step(self) -> None:
        n = len(self.finishes)
        budget, batched, context = self.budget - n, n, self.offset_sum + n * self.step
        i, completed, pairs = self.head, [], 0
        while i < len(self.queue) and budget > 0 and n + (i - self.head) < self.max_seqs:
            chunk = min(self.queue[i].prompt_tokens - self.done[i], budget)
            pairs += prefill_pairs(self.done[i], chunk)
            self.done[i] += chunk
            budget, batched, context = budget - chunk, batched + chunk, context + self.done[i]
            if self.done[i] < self.queue[i].prompt_tokens:
                break
            completed.append(i)
            i += 1
        self.time += self.m.step_time(batched, context, pairs)
        self._retire(self.step)
        self.step += 1
        for i in completed:
            self.ttft[i] = self.time
            q = self.queue[i]
            if q.output_tokens == 1:
                self._complete(i)
            else:
                self._join(q.prompt_tokens + 1, q.output_tokens - 1, i)
        self.head += len(completed)

    def _decode_stretch(self) -> None:
        """Decode-only steps up to the next finish or the first step ending past an arrival."""
        assert self.finishes, "a real call is left, so something decodes or waits to prefill"
        n, s = len(self.finishes), self.step
        k = self.finishes[0][0] - s + 1
        per_step = self.m.step_time(n, self.offset_sum + n * s)  # the first step's time
        growth = self.m.per_context_token_s * n  # each later step reads n more context tokens
        wait = self.next_arrival - self.time
        if wait < math.inf:
            k = min(k, _steps_to_reach(wait, per_step, growth))
        self.time += _total(k, per_step, growth)
        self.step = s + k
        self._retire(self.step - 1)

    def _retire(self, step: int) -> None:
        while self.finishes and self.finishes[0][0] <= step:
            _, offset, index = heapq.heappop(self.finishes)
            self.offset_sum -= offset
            if index >= 0:
                self._complete(index)

    def _complete(self, index: int) -> None:
        self.completion[index] = self.time
        if index < self.num_real:
            self.real_left -= 1


def _steps_to_reach(wait: float, first: float, growth: float) -> int:
    """Fewest steps (>= 1) whose total time `k*first + growth*k(k-1)/2` reaches `wait`."""
    if wait <= first:
        return 1
    if growth <= 0:
        return max(1, math.ceil(wait / first)) if first > 0 else 1 << 62
    b = first - growth / 2
    k = max(1, math.ceil((-b + math.sqrt(b * b + 2 * growth * wait)) / growth))
    while k > 1 and _total(k - 1, first, growth) >= wait:  # float rounding, either way
        k -= 1
    while _total(k, first, growth) < wait:
        k += 1
    return k


def _total(k: int, first: float, growth: float) -> float:
    return k * first + growth * k * (k - 1) / 2
