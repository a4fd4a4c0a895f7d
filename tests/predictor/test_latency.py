import dataclasses
import random
import tracemalloc

import pytest

from engine import (
    EngineConfig,
    LLMEngine,
    Request,
    SamplingParams,
    SimulatedRunner,
    StepShape,
    StepTimeModel,
    prefill_pairs,
)
from predictor.errors import InvalidCall
from predictor.latency import DecodingCall, EngineState, LatencyModel, QueuedCall, engine_state

STEP = StepTimeModel(
    overhead_s=0.01, per_token_s=0.001, per_context_token_s=1e-5, per_prefill_pair_s=2e-6
)
BUDGET, SEQS = 64, 8


def make_engine() -> LLMEngine:
    config = EngineConfig(
        num_blocks=4096,
        block_size=16,
        max_model_len=4096,
        max_num_batched_tokens=BUDGET,
        max_num_seqs=SEQS,
        enable_prefix_cache=False,
    )
    return LLMEngine(config, runner=SimulatedRunner(STEP, vocab_size=500), num_blocks=4096)


def submit_random(engine: LLMEngine, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    ids = []
    for i in range(n):
        prompt = [rng.randrange(1, 500) for _ in range(rng.randint(5, 150))]
        params = SamplingParams(max_tokens=rng.randint(1, 60), ignore_eos=True)
        ids.append(engine.add_request(prompt, params, request_id=f"r{i:03d}", detokenize=False))
    return ids


def run_to_end(engine: LLMEngine) -> dict[str, Request]:
    done = {}
    while engine.has_unfinished:
        for out in engine.step():
            if out.finished and out.request is not None:
                done[out.request_id] = out.request
    return done


def snapshot(engine: LLMEngine) -> tuple[EngineState, list[str]]:
    """The engine's state with true remaining lengths, and the ids of its queued calls."""
    sched = engine.scheduler
    state = engine_state(
        sched.running, sched.waiting, lambda r: r.params.max_tokens - r.num_output_tokens
    )
    mid_prefill = [
        r for r in sorted(sched.running, key=lambda r: r.sort_key) if not r.num_output_tokens
    ]
    ids = [r.request_id for r in mid_prefill + sorted(sched.waiting, key=lambda r: r.sort_key)]
    return state, ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replay_matches_the_simulated_engine_from_cold(seed: int) -> None:
    engine = make_engine()
    ids = submit_random(engine, 30, seed)
    state, queued_ids = snapshot(engine)
    assert queued_ids == ids
    estimates = LatencyModel(STEP, token_budget=BUDGET, max_num_seqs=SEQS).estimate_queue(state)
    done = run_to_end(engine)
    for rid, est in zip(ids, estimates, strict=True):
        assert est.ttft_s == pytest.approx(done[rid].first_token_time, abs=1e-9)
        assert est.completion_s == pytest.approx(done[rid].finish_time, abs=1e-9)


def test_replay_matches_the_engine_from_a_running_snapshot() -> None:
    engine = make_engine()
    submit_random(engine, 30, seed=5)
    for _ in range(23):
        engine.step()
    state, queued_ids = snapshot(engine)
    assert state.decoding and any(q.prefilled for q in state.queue)
    now = engine.now()
    estimates = LatencyModel(STEP, token_budget=BUDGET, max_num_seqs=SEQS).estimate_queue(state)
    done = run_to_end(engine)
    for rid, est in zip(queued_ids, estimates, strict=True):
        assert now + est.completion_s == pytest.approx(done[rid].finish_time, abs=1e-9)
        assert now + est.ttft_s == pytest.approx(done[rid].first_token_time, abs=1e-9)


def test_a_new_call_waits_behind_the_queue() -> None:
    model = LatencyModel(STEP, token_budget=BUDGET, max_num_seqs=SEQS)
    alone = model.estimate(EngineState(), QueuedCall(100, 10))
    busy = EngineState([DecodingCall(50, 30)] * 4, [QueuedCall(200, 20)] * 3)
    behind = model.estimate(busy, QueuedCall(100, 10))
    assert behind.ttft_s > alone.ttft_s and behind.completion_s > alone.completion_s
    assert (
        behind
        == model.estimate_queue(EngineState(busy.decoding, [*busy.queue, QueuedCall(100, 10)]))[-1]
    )
    ttfts = [e.ttft_s for e in model.estimate_queue(busy)]
    assert ttfts == sorted(ttfts)


def random_shape(rng: random.Random, prefill: bool) -> StepShape:
    if not prefill:
        return StepShape(rng.randint(1, 64), rng.randint(0, 20_000))
    start, chunk = rng.randint(0, 1024), rng.randint(2, 512)
    return StepShape(chunk, start + chunk, prefill_pairs(start, chunk))


def test_online_refit_recovers_the_step_model_every_refit_every_steps() -> None:
    true = StepTimeModel(0.02, 0.0005, 2e-6, 4e-7)
    model = LatencyModel(
        StepTimeModel(1.0, 0.0), token_budget=BUDGET, max_num_seqs=SEQS, refit_every=10
    )
    rng = random.Random(0)
    for i in range(30):
        shape = random_shape(rng, prefill=i % 3 == 0)
        model.observe_step(shape, true.shape_time(shape))
        assert (model.step_model.overhead_s == 1.0) is (i < 9)
    assert dataclasses.astuple(model.step_model) == pytest.approx(dataclasses.astuple(true))


@pytest.mark.parametrize(
    "state",
    [
        EngineState(queue=[QueuedCall(10, 0)]),
        EngineState(queue=[QueuedCall(10, 5, prefilled=10)]),
        EngineState(decoding=[DecodingCall(10, 0)]),
    ],
)
def test_impossible_states_are_refused(state: EngineState) -> None:
    with pytest.raises(InvalidCall):
        LatencyModel(STEP, token_budget=BUDGET, max_num_seqs=SEQS).estimate_queue(state)


def test_settings_where_decodes_overflow_a_step_are_refused() -> None:
    with pytest.raises(InvalidCall):
        LatencyModel(STEP, token_budget=8, max_num_seqs=8)


def test_expected_load_is_the_mean_of_recent_arrivals() -> None:
    model = LatencyModel(STEP, token_budget=BUDGET, max_num_seqs=SEQS, arrival_window=3)
    assert model.expected_load() is None
    model.observe_arrival(1.0, 100, 10)
    assert model.expected_load() is None
    for now, prompt, output in [(2.0, 200, 20), (3.0, 300, 30), (5.0, 400, 40)]:
        model.observe_arrival(now, prompt, output)
    load = model.expected_load()
    assert load is not None
    assert (load.gap_s, load.prompt_tokens, load.output_tokens) == (1.5, 300, 30)  # last three
    with pytest.raises(InvalidCall):
        model.observe_arrival(4.0, 1, 1)


def test_a_burst_of_arrivals_costs_no_more_to_replay_than_spread_ones() -> None:
    """64 arrivals within a millisecond: expected traffic of one call every 16 us, thousands per
    step; a replay that queued each of them would hold hundreds of thousands of calls."""
    model = LatencyModel(STEP, token_budget=BUDGET, max_num_seqs=SEQS)
    for i in range(64):
        model.observe_arrival(i * 1.6e-5, 100, 50)
    state = EngineState([DecodingCall(100, 50)], [])
    tracemalloc.start()
    try:
        estimate = model.estimate(state, QueuedCall(100, 200))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert 0 < estimate.ttft_s < estimate.completion_s
