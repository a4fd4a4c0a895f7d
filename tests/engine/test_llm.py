"""The synchronous core's handling of a runner that raises mid-step."""

import logging

import pytest

from engine.request import FinishReason
from engine.sampling import SamplingParams
from tests.engine.factories import make_flaky_engine

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def test_a_runner_failure_fails_only_the_requests_of_its_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    llm, runner = make_flaky_engine(fail_on={3}, max_num_seqs=2)
    for rid in ("a", "b", "waiting"):  # two running at once: "waiting" is in no plan yet
        llm.add_request(list(range(1, 10)), PARAMS, request_id=rid)
    llm.step()
    llm.step()
    with caplog.at_level(logging.ERROR, logger="engine.llm"):
        outputs = llm.step()
    assert runner.failed_plans == [["a", "b"]]
    assert [(o.request_id, o.finished, o.finish_reason) for o in outputs] == [
        ("a", True, FinishReason.ERROR),
        ("b", True, FinishReason.ERROR),
    ]
    assert all(o.new_token_ids == [] and o.request is not None for o in outputs)
    assert [r.exc_info is not None for r in caplog.records] == [True]  # logged once, with it
    llm.block_manager.check_invariants()
    assert set(llm.scheduler.requests) == {"waiting"}
    llm.add_request(list(range(1, 10)), PARAMS, request_id="after")
    done = {}
    while llm.has_unfinished:
        for out in llm.step():
            if out.finished and out.request is not None:
                done[out.request_id] = (out.finish_reason, out.request.num_output_tokens)
        llm.block_manager.check_invariants()
    assert done == {"waiting": (FinishReason.LENGTH, 6), "after": (FinishReason.LENGTH, 6)}
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
