"""The synchronous core: a runner that raises mid-step, stop strings, what one request's
tokens or prompt may do to the step every request shares."""

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from engine.config import EngineConfig
from engine.errors import InvalidRequest
from engine.llm import LLMEngine
from engine.request import FinishReason
from engine.sampling import SamplingParams
from tests.engine.byte_tokenizer import byte_tokenizer, fallback_tokenizer
from tests.engine.conftest import TINY_SHAPE
from tests.engine.factories import make_flaky_engine
from tests.engine.simulated import sim_core

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


def _run(max_tokens: int, stop: tuple[str, ...] = ()) -> tuple[str, FinishReason | None]:
    """The simulated engine's text and finish for one request (its tokens depend on its id)."""
    llm = sim_core()
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop=stop)
    llm.add_request([5, 6, 7], params, request_id="fixed")
    text, reason = "", None
    while llm.has_unfinished:
        for out in llm.step():
            text += out.new_text
            reason = out.finish_reason if out.finished else reason
    return text, reason


def test_a_stop_string_its_last_allowed_token_completes_is_a_stop() -> None:
    """The text was cut at the stop string but the finish said "length": a client would ask
    for a continuation of a text that had ended."""
    for n in range(3, 30):  # a token whose text is a character the text before it lacks
        before, whole = _run(n - 1)[0], _run(n)[0]
        last = whole[len(before) :]
        if whole.startswith(before) and last.isalnum() and last not in before:
            break
    else:
        raise AssertionError("no such token in the simulated engine's first 30")
    assert _run(n, stop=(last,)) == (before, FinishReason.STOP)
    assert _run(n + 5, stop=(last,)) == (before, FinishReason.STOP)
    assert _run(n - 1, stop=(last,)) == (before, FinishReason.LENGTH)


def tiny_engine(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> LLMEngine:
    """The tiny random Llama with `tokenizer` beside it."""
    path = Path(shutil.copytree(tiny_model_dir("llama"), tmp_path / "model"))
    tokenizer.save_pretrained(path)
    config = EngineConfig(model=str(path), num_blocks=64, num_threads=1, max_model_len=512)
    return LLMEngine(config)


def test_text_its_decoder_rewrites_ends_no_request(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """With a ByteFallback tokenizer (Llama 2, Mistral) a sampled stray byte token rewrites the
    text decoded before it, and DecodeStream raised "Invalid prefix encountered" out of the
    step, after the scheduler had taken its tokens: the step's outputs were lost, and the async
    engine failed every live request with ERROR, one request's draw costing them all."""
    llm = tiny_engine(tiny_model_dir, tmp_path, fallback_tokenizer(TINY_SHAPE["vocab_size"]))
    sampled = SamplingParams(max_tokens=32, temperature=1.0, seed=0, ignore_eos=True)
    llm.add_request([1, 100, 101], sampled, request_id="sampled")
    bystander = SamplingParams(max_tokens=32, ignore_eos=True)
    llm.add_request([1, 102], bystander, request_id="bystander", detokenize=False)
    done = {}
    while llm.has_unfinished:
        for out in llm.step():
            if out.finished and out.request is not None:
                done[out.request_id] = (out.finish_reason, out.request.num_output_tokens)
    assert done == {"sampled": (FinishReason.LENGTH, 32), "bystander": (FinishReason.LENGTH, 32)}
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_a_prompt_token_past_the_models_rows_is_refused_not_run(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """The core bounded prompt ids only by what the prefix cache encodes (2**64): an id past the
    model's 384 rows was admitted, and the embedding lookup raised in the step, failing the
    request beside it too."""
    llm = tiny_engine(tiny_model_dir, tmp_path, byte_tokenizer())
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    llm.add_request([5, 6, 7], params, request_id="good")
    for bad in (TINY_SHAPE["vocab_size"], 2**40):
        with pytest.raises(InvalidRequest, match="token ids"):
            llm.add_request([5, 6, bad], params, request_id="bad")
    done: dict[str, FinishReason | None] = {}
    while llm.has_unfinished:
        done |= {out.request_id: out.finish_reason for out in llm.step() if out.finished}
    assert done == {"good": FinishReason.LENGTH}
