import pytest

from engine.config import ReserveMode
from engine.errors import InvalidRequest, RequestNotFound
from engine.plan import StepOutput, StepPlan
from engine.request import FinishReason, RequestStatus
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from tests.engine.factories import make_request, make_scheduler


def run_step(sched: Scheduler, now: float = 0.0, token: int = 5) -> StepPlan:
    plan = sched.schedule()
    sampled = {s.request_id: token for s in plan.seqs if s.sample}
    sched.update(plan, StepOutput(sampled=sampled), now)
    return plan


def test_prefill_is_chunked_by_the_token_budget() -> None:
    sched = make_scheduler(num_blocks=32, token_budget=8)
    sched.add(make_request("a", prompt_len=20, max_tokens=2))
    plans = [run_step(sched) for _ in range(3)]
    assert [len(p.seqs[0].token_ids) for p in plans] == [8, 8, 4]
    assert [p.seqs[0].sample for p in plans] == [False, False, True]
    assert sched.requests["a"].output_token_ids == [5]


def test_running_decodes_come_before_new_prefills() -> None:
    sched = make_scheduler(num_blocks=32, token_budget=6)
    sched.add(make_request("a", prompt_len=4, max_tokens=5))
    run_step(sched)
    sched.add(make_request("b", prompt_len=12, max_tokens=5))
    plan = run_step(sched)
    assert [(s.request_id, len(s.token_ids)) for s in plan.seqs] == [("a", 1), ("b", 5)]


def test_finishes_on_max_tokens_and_eos_and_frees_blocks() -> None:
    sched = make_scheduler(num_blocks=16)
    sched.add(make_request("a", prompt_len=3, max_tokens=3))
    for _ in range(3):
        run_step(sched)
    assert "a" not in sched.requests
    req = make_request("b", prompt_len=3, max_tokens=10)
    req.params = type(req.params)(max_tokens=10)  # honours EOS
    sched.add(req)
    run_step(sched, token=0)
    assert req.finish_reason is FinishReason.STOP and req.output_token_ids == [0]
    assert sched.blocks.num_free_blocks == 16


def test_preempts_lowest_priority_newest_and_recomputes() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4, token_budget=64)
    sched.add(make_request("hi", prompt_len=7, max_tokens=6, priority=0.0))
    sched.add(make_request("lo", prompt_len=7, max_tokens=6, priority=1.0))
    run_step(sched)  # both admitted: 2 blocks each
    run_step(sched)  # both at 8 tokens of KV, still 4 blocks
    plan = run_step(sched)  # hi needs a 3rd block: lo is the victim
    assert plan.preempted_ids == ["lo"]
    lo = sched.requests["lo"]
    assert lo.status is RequestStatus.PREEMPTED and lo.block_ids == []
    assert lo.num_output_tokens == 2
    while sched.has_unfinished:
        run_step(sched)
    # 9 tokens of KV were lost; its 2 full blocks revive from the prefix cache
    assert lo.num_preemptions == 1 and lo.num_recomputed_tokens == 1
    assert lo.output_token_ids == [5] * 6
    assert sched.blocks.num_free_blocks == 4


def test_reserve_modes_promise_different_amounts_and_allocate_lazily() -> None:
    promised = {}
    for mode in ReserveMode:
        sched = make_scheduler(num_blocks=64, block_size=4, reserve_mode=mode)
        req = make_request("a", prompt_len=8, max_tokens=40)
        req.predicted_output_len = 12
        sched.add(req)
        sched.schedule()
        assert len(req.block_ids) == 2  # only the prompt is allocated
        promised[mode] = 64 - sched.capacity().free_blocks
    assert promised == {ReserveMode.NONE: 2, ReserveMode.PREDICTED: 5, ReserveMode.MAX: 12}


def test_admission_respects_other_requests_reservations() -> None:
    sched = make_scheduler(num_blocks=8, block_size=4, reserve_mode=ReserveMode.PREDICTED)
    first = make_request("first", prompt_len=4, max_tokens=40, arrival=0.0)
    first.predicted_output_len = 20  # promises 6 of the 8 blocks
    second = make_request("second", prompt_len=8, max_tokens=4, arrival=1.0)
    second.predicted_output_len = 4  # needs 3 blocks: only 2 are unpromised
    sched.add(first)
    sched.add(second)
    plan = sched.schedule()
    assert [s.request_id for s in plan.seqs] == ["first"]
    assert sched.blocks.num_free_blocks == 7


def test_a_refined_prediction_moves_a_running_requests_reservation() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4, reserve_mode=ReserveMode.PREDICTED)
    request = make_request("a", prompt_len=4, max_tokens=40, arrival=0.0)
    request.predicted_output_len = 20  # 24 tokens: 6 blocks promised, 1 allocated
    sched.add(request)
    sched.schedule()
    assert sched.capacity().free_blocks == 10
    sched.set_prediction("a", 4)  # 8 tokens: 2 blocks
    assert sched.capacity().free_blocks == 14
    sched.set_prediction("a", 100)  # capped at max_tokens: 44 tokens, 11 blocks
    assert sched.capacity().free_blocks == 5
    with pytest.raises(InvalidRequest):
        sched.set_prediction("a", -1)
    with pytest.raises(RequestNotFound):
        sched.set_prediction("gone", 4)


def test_a_refined_prediction_of_a_waiting_request_is_what_admission_reserves() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4, reserve_mode=ReserveMode.PREDICTED)
    request = make_request("a", prompt_len=4, max_tokens=40, arrival=0.0)
    request.predicted_output_len = 36
    sched.add(request)
    sched.set_prediction("a", 12)  # before admission: 16 tokens, 4 blocks
    sched.schedule()
    assert sched.capacity().free_blocks == 12


def test_admission_stops_at_first_request_that_does_not_fit() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4, reserve_mode=ReserveMode.MAX)
    sched.add(make_request("big", prompt_len=4, max_tokens=12, arrival=0.0))
    sched.add(make_request("small", prompt_len=2, max_tokens=2, arrival=1.0))
    sched.add(make_request("next", prompt_len=2, max_tokens=2, arrival=2.0))
    plan = sched.schedule()
    assert [s.request_id for s in plan.seqs] == ["big"]


def test_abort_frees_blocks_and_reports_to_runner() -> None:
    sched = make_scheduler(num_blocks=8)
    sched.add(make_request("a", prompt_len=10, max_tokens=4))
    run_step(sched)
    sched.abort("a")
    assert sched.blocks.num_free_blocks == 8
    assert sched.schedule().freed_ids == ["a"]


def test_prefix_cache_hit_skips_computed_blocks() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4)
    first = make_request("a", prompt_len=10, max_tokens=1)
    sched.add(first)
    run_step(sched)
    second = make_request("b", prompt_len=10, max_tokens=1)
    second.prompt_token_ids = list(first.prompt_token_ids)
    sched.add(second)
    plan = sched.schedule()
    assert plan.seqs[0].start_pos == 8 and len(plan.seqs[0].token_ids) == 2
    assert second.num_cached_tokens == 8


def test_simulated_runner_stops_at_a_given_true_length() -> None:
    from tests.engine.factories import make_sim_engine

    llm = make_sim_engine(num_blocks=64)
    rid = llm.add_request([1, 2, 3], SamplingParams(max_tokens=100), detokenize=False)
    llm.runner.set_output_length(rid, 7)  # type: ignore[attr-defined]
    finished = []
    while llm.has_unfinished:
        finished += [out.request for out in llm.step() if out.finished]
    assert len(finished) == 1 and finished[0] is not None
    assert finished[0].num_output_tokens == 7
    assert finished[0].finish_reason is FinishReason.STOP
    assert llm.block_manager.num_free_blocks == 64


@pytest.mark.parametrize("bad_token", [-1, 2**64])
def test_token_ids_the_prefix_cache_cannot_encode_are_refused(bad_token: int) -> None:
    scheduler = make_scheduler()
    request = make_request("a", prompt_len=6)
    request.prompt_token_ids[3] = bad_token
    with pytest.raises(InvalidRequest, match="token ids"):
        scheduler.add(request)
    assert not scheduler.has_unfinished


def test_min_tokens_holds_back_eos_and_stop_token_ids() -> None:
    sched = make_scheduler(num_blocks=16)  # EOS is token 0
    request = make_request("a", prompt_len=3, max_tokens=10)
    request.params = SamplingParams(max_tokens=10, min_tokens=3, stop_token_ids=(7,))
    sched.add(request)
    run_step(sched, token=0)
    run_step(sched, token=7)
    assert request.finish_reason is None and request.output_token_ids == [0, 7]
    run_step(sched, token=7)
    assert request.finish_reason is FinishReason.STOP and request.num_output_tokens == 3
    assert sched.blocks.num_free_blocks == 16
