"""Discrete-event simulation of the gateway's dispatch over the real engine core.

The clock is the engine's virtual time (`LLMEngine.now()`: the simulated runner's modelled step
times add up). Each turn of the loop: release what is due (job arrivals, whose root calls become
ready after their think delay; calls whose parents finished plus their think delay), dispatch
through the gateway's own `DispatchCore` (the policy's order, routed to the engine while it has
room; the engine's capacity counts the output that calls still waiting in it will reserve), then
one engine step whose tokens go to the core as progress and finishes; after a re-key the engine
gets the new priority of the job's calls it holds, as the gateway tells its backends; an idle
engine jumps the clock to the next event. There is no quota store, so every call is dispatched
at once. The real scheduler and block manager decide batching, KV and preemption. A
`CallPredictor` (`predictions.py`; a fixed mapping for the study) predicts each node when its job
arrives and each call again when it becomes ready (what the policy orders it by, what the engine
reserves), hears each call's progress and its true length when it finishes, and when it says so
(a kind of a tenant's calls turned conservative) plans that tenant's ready calls again
(`DispatchCore.replan`, as the gateway). With `share_slots` (`EngineSetup`) the running calls
the core chooses to yield (`DispatchCore.to_yield`) are aborted in the engine at once and wait
among the ready calls to run again from their prompts, planned again as the gateway plans a
call sent back. A closed loop
(`followers`): a job named there is followed by its follower, which arrives the moment it
finishes (a client that sends its next job when the last one ends). Invariant:
every job that arrives finishes, each of its calls finishes exactly once (dispatched once, and
once more after each yield), and a job leaves the policy when its last call finishes.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from bench.sim.errors import SimulationStuck
from bench.sim.predictions import CallPredictor, FixedPredictions
from bench.sim.runner import TraceRunner
from bench.workloads.format import Job, Node
from engine import EngineConfig, LLMEngine, SamplingParams, StepTimeModel
from gateway.backends import BackendCapacity, engine_capacity
from gateway.core_call import CoreCall, Replanner, Reprioritize
from gateway.dispatch_core import DispatchCore
from tenants.policies import JobInfo, NodeCost, Policy, ReadyCall, kv_token_time

Predictions = Mapping[tuple[str, str], float]  # (job id, node id) -> predicted output tokens


@dataclass(frozen=True, slots=True)
class EngineSetup:
    config: EngineConfig
    step_model: StepTimeModel
    knee_calls: int | None  # told to the policy; None: no knee
    # the dispatch core's `share_slots`: a tenant over its share of the slots yields its newest
    # call to a waiting call of a tenant under it, and the knee holds the batch while a light
    # tenant runs (gateway/dispatch_core.py)
    share_slots: bool = False


@dataclass(slots=True)
class SimResult:
    policy: str
    finish: dict[str, float]  # job id -> finish time
    output_tokens: int = 0
    work: float = 0.0  # KV token-time of the finished calls
    steps: int = 0
    end_time: float = 0.0
    busy_s: float = 0.0  # time spent in engine steps
    preemptions: int = 0
    # KV token-time served, and seconds, over steps taken while a ready call had no room
    saturated_work: float = 0.0
    saturated_s: float = 0.0
    saturated_steps: int = 0
    # (time, cumulative KV token-time served per tenant), at most one snapshot per `record_s`
    service: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    arrived: dict[str, float] = field(default_factory=dict)  # follower job id -> its arrival


@dataclass(slots=True)
class _JobState:
    job: Job
    nodes: dict[str, Node]
    children: dict[str, list[str]]
    parents_left: dict[str, int]
    calls_left: int


class Simulation:
    def __init__(
        self,
        jobs: Sequence[Job],
        policy: Policy,
        setup: EngineSetup,
        predictions: Predictions | CallPredictor,
        record_s: float | None = None,
        stop_after_work: float | None = None,
        followers: Mapping[str, Job] | None = None,
    ) -> None:
        self.runner = TraceRunner(setup.step_model)
        self.engine = LLMEngine(setup.config, runner=self.runner)
        self.policy = policy
        self.core: DispatchCore[None] = DispatchCore(
            policy, setup.knee_calls, share_slots=setup.share_slots
        )
        self.predictor: CallPredictor = (
            FixedPredictions(predictions) if isinstance(predictions, Mapping) else predictions
        )
        self.record_s = record_s
        self.stop_after_work = stop_after_work  # a capacity probe stops once this much is done
        self.arrivals = sorted(jobs, key=lambda j: (j.arrival, j.job_id), reverse=True)
        # closed loop: job id -> the job that arrives when it finishes (its own arrival unused)
        self.followers = dict(followers or {})
        self.timers: list[tuple[float, int, str, str]] = []  # (due, seq, job id, node id)
        self.seq = 0
        self.states: dict[str, _JobState] = {}
        self.produced: dict[str, int] = {}  # running call id -> tokens so far
        self.served: dict[str, float] = defaultdict(float)
        self.result = SimResult(policy.name, {})

    def run(self) -> SimResult:
        total = len(self.arrivals) + len(self.followers)
        while self.arrivals or self.timers or self.core.ready or self.engine.has_unfinished:
            if self.stop_after_work is not None and self.result.work >= self.stop_after_work:
                break
            now = self.engine.now()
            self._release(now)
            self._dispatch(now)
            if self.engine.has_unfinished:
                before = self.engine.virtual_time
                self._step()
                if self.engine.virtual_time == before:
                    raise SimulationStuck(f"t={now:.3f}s: the engine admits none of its calls")
                continue
            due = [t for t in (self._next_arrival(), self._next_timer()) if t is not None]
            if not due:
                raise SimulationStuck(f"t={now:.3f}s: {len(self.core.ready)} ready calls never fit")
            self.engine.virtual_time = max(now, min(due))
        self.result.end_time = self.engine.now()
        self.result.preemptions = self.engine.scheduler.num_preemptions
        self._snapshot(force=True)
        assert self.stop_after_work is not None or len(self.result.finish) == total
        return self.result

    def _next_arrival(self) -> float | None:
        return self.arrivals[-1].arrival if self.arrivals else None

    def _next_timer(self) -> float | None:
        return self.timers[0][0] if self.timers else None

    def _release(self, now: float) -> None:
        while self.arrivals and self.arrivals[-1].arrival <= now:
            self._arrive(self.arrivals.pop(), now)
        while self.timers and self.timers[0][0] <= now:
            _, _, job_id, node_id = heapq.heappop(self.timers)
            self._make_ready(self.states[job_id], node_id, now)

    def _arrive(self, job: Job, now: float) -> None:
        children: dict[str, list[str]] = {n.node_id: [] for n in job.nodes}
        for node in job.nodes:
            for parent in set(node.parents):
                children[parent].append(node.node_id)
        nodes = {n.node_id: n for n in job.nodes}
        parents_left = {n.node_id: len(set(n.parents)) for n in job.nodes}
        state = _JobState(job, nodes, children, parents_left, len(job.nodes))
        self.states[job.job_id] = state
        costs = tuple(
            NodeCost(
                n.node_id,
                n.parents,
                n.prompt_tokens,
                self.predictor.estimate(job, n),
                n.max_tokens,
                n.output_tokens,
            )
            for n in job.nodes
        )
        self.core.add_job(JobInfo(job.job_id, job.tenant, job.weight, job.arrival, costs), now)
        for node in job.nodes:
            if not node.parents:
                self._schedule(state, node.node_id, job.arrival, now)

    def _schedule(self, state: _JobState, node_id: str, since: float, now: float) -> None:
        due = since + state.nodes[node_id].think_s
        if due <= now:
            self._make_ready(state, node_id, now)
        else:
            heapq.heappush(self.timers, (due, self.seq, state.job.job_id, node_id))
            self.seq += 1

    def _make_ready(self, state: _JobState, node_id: str, now: float) -> None:
        job, node = state.job, state.nodes[node_id]
        estimate = self.predictor.plan(job, node, now)
        call = ReadyCall(
            f"{job.job_id}/{node_id}",
            job.job_id,
            job.tenant,
            node_id,
            node.prompt_tokens,
            estimate.policy_output,
            node.max_tokens,
        )
        self.core.add_ready(call, estimate.reserve_output, None, now, reserved=True)

    def _capacities(self) -> dict[str, BackendCapacity]:
        cap = self.engine.scheduler.capacity()
        return {"engine": engine_capacity(cap, self.engine.block_manager.block_size)}

    def _dispatch(self, now: float) -> None:
        """Send the calls the core picks, then abort those it chooses to yield (at once here,
        where the gateway waits for each aborted stream to end) and pick again, until it
        chooses none (each is chosen once for a waiting call, so this ends)."""
        self._send(now)
        while victims := self.core.to_yield(now, self._capacities()):
            for victim in victims:
                call_id = victim.call.call_id
                self.engine.abort(call_id)
                del self.produced[call_id]
                if self.core.yielded(call_id, now) is not None:  # runs again from its prompt
                    self._reprioritize(self.core.replan_call(call_id, self._replanned(now), now))
            self._send(now)

    def _send(self, now: float) -> None:
        while (dispatch := self.core.next(now, self._capacities())) is not None:
            entry = dispatch.entry
            call = entry.call
            if dispatch.taken:  # a call that yielded asks for its quota again: none here
                self.core.launched(call.call_id, now)
            node = self.states[call.job_id].nodes[call.node_id]
            self.runner.expect(call.call_id, node.output_tokens)
            self.engine.add_request(
                [1] * call.prompt_tokens,
                SamplingParams(max_tokens=node.max_tokens),
                request_id=call.call_id,
                priority=entry.priority,
                predicted_output_len=entry.reserve_output,
                detokenize=False,
            )
            self.produced[call.call_id] = 0

    def _step(self) -> None:
        start = self.engine.now()
        outputs = self.engine.step()
        now = self.engine.now()
        self.result.steps += 1
        self.result.busy_s += now - start
        step_work = 0.0
        for out in outputs:
            call_id = out.request_id
            job_id, node_id = call_id.rsplit("/", 1)
            state = self.states[job_id]
            prompt = state.nodes[node_id].prompt_tokens
            produced = self.produced[call_id] + len(out.new_token_ids)
            work = (prompt + produced) * len(out.new_token_ids)
            self.served[state.job.tenant] += work
            step_work += work
            self.result.output_tokens += len(out.new_token_ids)
            if out.finished:
                del self.produced[call_id]
                self.result.work += kv_token_time(prompt, produced)
                self._reprioritize(self.core.finished(call_id, prompt, produced, now))
                if self.predictor.observe(state.job, state.nodes[node_id], produced, now):
                    self._replan(state.job.tenant, now)
                self._node_done(state, node_id, now)
            else:
                self.produced[call_id] = produced
                if self.predictor.progressed(state.job, state.nodes[node_id], produced, now):
                    self._replan(state.job.tenant, now)
                self._reprioritize(self.core.progress(call_id, produced, now))
        if self.core.blocked:
            self.result.saturated_work += step_work
            self.result.saturated_s += now - start
            self.result.saturated_steps += 1
        self._snapshot()

    def _replan(self, tenant: str, now: float) -> None:
        """The predictor plans the tenant's ready calls again (a kind of its calls turned
        conservative), through the core as the gateway does."""
        self._reprioritize(self.core.replan(tenant, self._replanned(now), now))

    def _replanned(self, now: float) -> Replanner[None]:
        """A ready call as the predictor plans it again now, or None where nothing changed."""

        def again(entry: CoreCall[None]) -> tuple[ReadyCall, int] | None:
            call = entry.call
            state = self.states[call.job_id]
            estimate = self.predictor.replan(state.job, state.nodes[call.node_id], now)
            if estimate is None:
                return None
            return replace(call, predicted_output=estimate.policy_output), estimate.reserve_output

        return again

    def _reprioritize(self, changes: list[Reprioritize[None]]) -> None:
        """The job was re-keyed: its calls in the engine get their new priority."""
        scheduler = self.engine.scheduler
        for change in changes:
            call_id = change.entry.call.call_id
            if call_id in scheduler.requests:  # not finished this step
                scheduler.set_priority(call_id, change.priority)

    def _node_done(self, state: _JobState, node_id: str, now: float) -> None:
        state.calls_left -= 1
        if state.calls_left == 0:
            job_id = state.job.job_id
            self.core.remove_job(job_id, now)
            self.result.finish[job_id] = now
            del self.states[job_id]
            follower = self.followers.pop(job_id, None)
            if follower is not None:
                self.result.arrived[follower.job_id] = now
                self.arrivals.append(follower.at(now))  # the latest arrival: pops next
            return
        for child in state.children[node_id]:
            state.parents_left[child] -= 1
            if state.parents_left[child] == 0:
                self._schedule(state, child, now, now)

    def _snapshot(self, force: bool = False) -> None:
        if self.record_s is None:
            return
        now = self.engine.now()
        last = self.result.service[-1][0] if self.result.service else -math.inf
        if force or now - last >= self.record_s:
            self.result.service.append((now, dict(self.served)))
