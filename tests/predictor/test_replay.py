import pytest

from engine import EngineConfig, LLMEngine, SamplingParams, SimulatedRunner, StepTimeModel
from predictor.latency import LatencyModel, engine_state
from predictor.replay import (
    ArrivalLoad,
    DecodingCall,
    EngineState,
    QueuedCall,
    Replay,
    _steps_to_reach,
    _total,
)

STEP = StepTimeModel(overhead_s=0.01, per_token_s=0.001, per_context_token_s=1e-5)


@pytest.mark.parametrize(
    ("wait", "first", "growth"),
    [(0.5, 0.01, 0.0), (0.5, 0.01, 1e-4), (0.005, 0.01, 1e-3), (10.0, 0.02, 3e-5), (1.0, 0.3, 0.0)],
)
def test_steps_to_reach_is_the_fewest_steps_covering_the_wait(
    wait: float, first: float, growth: float
) -> None:
    k = _steps_to_reach(wait, first, growth)
    assert _total(k, first, growth) >= wait
    assert k == 1 or _total(k - 1, first, growth) < wait


def test_expected_arrivals_slow_a_call_down() -> None:
    state = EngineState([DecodingCall(100, 50)], [QueuedCall(80, 40)])
    quiet = Replay(STEP, 64, 8, state).run()
    busy = Replay(STEP, 64, 8, state, ArrivalLoad(0.05, 100, 40)).run()
    assert len(busy) == 1  # only real calls are reported
    assert busy[0].ttft_s >= quiet[0].ttft_s  # arrivals queue behind it, sharing its steps
    assert busy[0].completion_s > quiet[0].completion_s


def test_periodic_identical_traffic_is_predicted_closely() -> None:
    """Calls of one size every 0.15 s through the simulated engine, estimated at arrival."""
    config = EngineConfig(num_blocks=4096, max_num_batched_tokens=64, max_num_seqs=8,
                          enable_prefix_cache=False, max_model_len=4096)  # fmt: skip
    llm = LLMEngine(config, runner=SimulatedRunner(STEP, vocab_size=500), num_blocks=4096)
    latency = LatencyModel(STEP, token_budget=64, max_num_seqs=8, arrival_window=8)
    with_load: dict[str, tuple[float, float]] = {}
    without: dict[str, float] = {}
    done: dict[str, float] = {}

    def step() -> None:
        for out in llm.step():
            if out.request is not None and out.request.finish_time is not None:
                done[out.request_id] = out.request.finish_time

    for i in range(60):
        while llm.now() < 0.15 * i:
            if llm.has_unfinished:
                step()
            else:
                llm.virtual_time = 0.15 * i
        rid = llm.add_request([i % 400 + 1] * 40, SamplingParams(max_tokens=30, ignore_eos=True),
                              request_id=f"r{i:03d}", detokenize=False)  # fmt: skip
        latency.observe_arrival(llm.now(), 40, 30)
        sched = llm.scheduler
        state = engine_state(sched.running, sched.waiting,
                             lambda r: r.params.max_tokens - r.num_output_tokens)  # fmt: skip
        with_load[rid] = (llm.now(), latency.estimate_queue(state)[-1].completion_s)
        without[rid] = latency.estimate_queue(state, with_load=False)[-1].completion_s
    while llm.has_unfinished:
        step()
    steady = [f"r{i:03d}" for i in range(10, 50)]  # past warm-up, before the traffic stops
    errors = [abs(with_load[r][1] / (done[r] - with_load[r][0]) - 1) for r in steady]
    blind = [abs(without[r] / (done[r] - with_load[r][0]) - 1) for r in steady]
    assert max(errors) < 0.03
    assert sum(errors) < sum(blind) / 10  # knowing the traffic is what makes it accurate
