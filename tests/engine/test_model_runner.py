"""The model runner against HuggingFace on tiny random models in fp32 (and SmolLM2, integration)."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from engine import model_runner
from engine.attention import build_step_batch
from engine.config import EngineConfig
from engine.errors import InvalidRequest, UnsupportedModel
from engine.hidden import hidden_layer
from engine.llm import LLMEngine
from engine.loader import resolve_model
from engine.model_runner import ModelRunner
from engine.plan import ScheduledSeq, StepPlan
from engine.row_ops import TorchRowOps
from engine.sampling import SamplingParams
from tests.engine.byte_tokenizer import byte_tokenizer

FAMILIES = ["llama", "qwen2"]
BLOCK_SIZE = 16
GREEDY = SamplingParams(max_tokens=64)
PROMPT_LENS = [1, 7, 16, 17, 40, 70]


class BlockTables:
    """A trivial allocator: each request's table grows from a shared counter, never freed."""

    def __init__(self, block_size: int = BLOCK_SIZE) -> None:
        self.block_size = block_size
        self._next = 0
        self.tables: dict[str, list[int]] = {}

    def covering(self, request_id: str, num_tokens: int) -> list[int]:
        table = self.tables.setdefault(request_id, [])
        while len(table) * self.block_size < num_tokens:
            table.append(self._next)
            self._next += 1
        return list(table)


def make_runner(path: Path, num_blocks: int = 96, block_size: int = BLOCK_SIZE) -> ModelRunner:
    config = EngineConfig(block_size=block_size, num_threads=2, max_model_len=512)
    return ModelRunner(path, config, num_blocks=num_blocks)


def make_prompts(lens: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]


def runner_generate(
    runner: ModelRunner, prompts: list[list[int]], max_new: int, chunk: int
) -> list[list[int]]:
    """Greedy generation, every request in every step: its next prefill chunk or its decode."""
    tokens = {str(i): list(p) for i, p in enumerate(prompts)}
    outputs: dict[str, list[int]] = {rid: [] for rid in tokens}
    computed = dict.fromkeys(tokens, 0)
    blocks = BlockTables(runner.block_size)
    while any(len(out) < max_new for out in outputs.values()):
        seqs = []
        for rid, toks in tokens.items():
            if len(outputs[rid]) == max_new:
                continue
            n = min(chunk, len(toks) - computed[rid])
            end = computed[rid] + n
            table = blocks.covering(rid, end)
            seqs.append(
                ScheduledSeq(
                    rid,
                    toks[computed[rid] : end],
                    computed[rid],
                    table,
                    end == len(toks),
                    GREEDY,
                    len(outputs[rid]),
                )
            )
            computed[rid] = end
        output = runner.execute(StepPlan(seqs, sum(len(s.token_ids) for s in seqs)))
        for rid, token in output.sampled.items():
            tokens[rid].append(token)
            outputs[rid].append(token)
    return [outputs[str(i)] for i in range(len(prompts))]


def hf_generate(model: PreTrainedModel, prompt: list[int], max_new: int) -> list[int]:
    out = model.generate(  # type: ignore[operator]
        torch.tensor([prompt]),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt) :]]


def load_hf(path: Path) -> PreTrainedModel:
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train(False)
    return model


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("chunk", [5, 1000], ids=["chunked", "one-go"])
def test_greedy_matches_hf_generate(
    tiny_model_dir: Callable[[str], Path], family: str, chunk: int
) -> None:
    path = tiny_model_dir(family)
    runner, hf = make_runner(path), load_hf(path)
    prompts = make_prompts(PROMPT_LENS, runner.vocab_size)
    got = runner_generate(runner, prompts, max_new=12, chunk=chunk)
    assert got == [hf_generate(hf, p, 12) for p in prompts]


@pytest.mark.parametrize("kernels", [True, False], ids=["kernel-ops", "torch-only"])
def test_torch_attention_path_matches_hf_where_the_kernel_does_not_apply(
    tiny_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, kernels: bool
) -> None:
    """8-token blocks take the torch attention path; without kernels every op is torch (CUDA's)."""
    if not kernels:
        monkeypatch.setattr(model_runner, "load_cpu_kernels", lambda: None)
    path = tiny_model_dir("qwen2")
    runner, hf = make_runner(path, num_blocks=192, block_size=8), load_hf(path)
    assert runner.attention.kernel is None  # the CPU kernel needs 16-token blocks
    assert isinstance(runner.decoder.ops, TorchRowOps) != kernels
    prompts = make_prompts(PROMPT_LENS, runner.vocab_size)
    got = runner_generate(runner, prompts, max_new=8, chunk=5)
    assert got == [hf_generate(hf, p, 8) for p in prompts]


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_and_decode_logits_close_to_hf(
    tiny_model_dir: Callable[[str], Path], family: str
) -> None:
    path = tiny_model_dir(family)
    runner, hf = make_runner(path), load_hf(path)
    short, long = make_prompts([9, 37], runner.vocab_size, seed=1)
    blocks = BlockTables()
    # step 1 prefills `long` whole; step 2 decodes its next token beside a prefill chunk of `short`
    steps = [
        [ScheduledSeq("long", long[:-1], 0, blocks.covering("long", 36), True, GREEDY, 0)],
        [
            ScheduledSeq("short", short, 0, blocks.covering("short", 9), True, GREEDY, 0),
            ScheduledSeq("long", long[-1:], 36, blocks.covering("long", 37), True, GREEDY, 1),
        ],
    ]
    got = []
    with torch.inference_mode():
        for seqs in steps:
            batch = build_step_batch(seqs, BLOCK_SIZE, runner.device)
            hidden = runner.decoder.forward(batch, runner.attention)
            logits = runner.decoder.logits(hidden)
            got.append({seqs[i].request_id: logits[rows] for i, rows in _rows(batch).items()})
        want_long = hf(torch.tensor([long])).logits[0]
        want_short = hf(torch.tensor([short])).logits[0]
    torch.testing.assert_close(got[0]["long"], want_long[:-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1]["long"], want_long[-1:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1]["short"], want_short, atol=1e-4, rtol=1e-4)


def _rows(batch: object) -> dict[int, slice]:
    """Plan index -> packed rows of that sequence in a StepBatch."""
    order, last_rows = batch.seq_order, batch.last_rows  # type: ignore[attr-defined]
    firsts = [0, *[r + 1 for r in last_rows[:-1]]]
    return {
        i: slice(first, last + 1) for i, first, last in zip(order, firsts, last_rows, strict=True)
    }


def test_hidden_state_is_the_last_prompt_tokens_state_at_the_tapped_layer(
    tiny_model_dir: Callable[[str], Path],
) -> None:
    path = tiny_model_dir("llama")
    runner, hf = make_runner(path), load_hf(path)
    assert runner.hidden_layer == hidden_layer(2) == 1
    a, b = make_prompts([30, 12], runner.vocab_size, seed=2)
    blocks = BlockTables()
    table = blocks.covering("a", 30)
    first = ScheduledSeq("a", a[:20], 0, table, False, GREEDY, 0, want_hidden=True)
    last = ScheduledSeq("a", a[20:], 20, table, True, GREEDY, 0, want_hidden=True)
    other = ScheduledSeq("b", b, 0, blocks.covering("b", 12), True, GREEDY, 0, want_hidden=True)
    plain = ScheduledSeq("c", b, 0, blocks.covering("c", 12), True, GREEDY, 0)
    assert runner.execute(StepPlan([first], 20)).hidden == {}  # not the sampling chunk
    got = runner.execute(StepPlan([other, last, plain], 34)).hidden
    assert set(got) == {"a", "b"}
    with torch.inference_mode():
        for rid, prompt in (("a", a), ("b", b)):
            states = hf.model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
            want = states[runner.hidden_layer][0, -1]
            torch.testing.assert_close(torch.tensor(got[rid]), want, atol=1e-4, rtol=1e-4)


def test_step_without_hidden_requests_returns_no_vectors(
    tiny_model_dir: Callable[[str], Path],
) -> None:
    runner = make_runner(tiny_model_dir("qwen2"))
    seq = ScheduledSeq("a", [5, 6, 7], 0, BlockTables().covering("a", 3), True, GREEDY, 0)
    output = runner.execute(StepPlan([seq], 3))
    assert output.hidden == {} and set(output.sampled) == {"a"} and output.elapsed_s > 0


def test_kv_bytes_per_block_counts_keys_and_values_of_every_layer(
    tiny_model_dir: Callable[[str], Path],
) -> None:
    runner = make_runner(tiny_model_dir("llama"), num_blocks=4)
    config = runner.model_config
    # 2 (k, v) x layers x kv heads x head dim x block size x 4 bytes
    assert ModelRunner.kv_bytes_per_block(config, 16, "float32") == 2 * 2 * 2 * 64 * 16 * 4
    assert ModelRunner.kv_bytes_per_block(config, 16, torch.bfloat16) == 2 * 2 * 2 * 64 * 16 * 2
    cache = runner.attention.cache
    pool_bytes = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
    assert pool_bytes == 4 * ModelRunner.kv_bytes_per_block(config, 16, "float32")


def test_num_blocks_for_divides_the_kv_budget(tiny_model_dir: Callable[[str], Path]) -> None:
    per_block = 2 * 2 * 2 * 64 * 16 * 2  # tiny llama, bf16
    config = EngineConfig(dtype="bfloat16", block_size=16, kv_cache_bytes=10 * per_block + 5)
    assert ModelRunner.num_blocks_for(tiny_model_dir("llama"), config) == 10


def test_runner_exposes_vocab_eos_and_context_limit(tiny_model_dir: Callable[[str], Path]) -> None:
    runner = make_runner(tiny_model_dir("qwen2"))
    assert runner.vocab_size == 384
    assert runner.eos_token_ids == frozenset({2})
    assert runner.max_model_len == 512


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_matches_hf_on_cuda(tiny_model_dir: Callable[[str], Path]) -> None:
    path = tiny_model_dir("qwen2")
    config = EngineConfig(block_size=BLOCK_SIZE, device="cuda", max_model_len=512)
    runner = ModelRunner(path, config, num_blocks=96)
    assert runner.attention.kernel is None
    prompts = make_prompts(PROMPT_LENS, runner.vocab_size)
    hf = load_hf(path)
    assert runner_generate(runner, prompts, 8, chunk=5) == [hf_generate(hf, p, 8) for p in prompts]


@pytest.mark.integration
def test_smollm2_greedy_matches_hf_generate() -> None:
    path = resolve_model("default")
    config = EngineConfig(block_size=BLOCK_SIZE, num_threads=2, max_model_len=1024)
    runner, hf = ModelRunner(path, config, num_blocks=64), load_hf(path)
    prompts = make_prompts([12, 45, 80], runner.vocab_size, seed=3)
    got = runner_generate(runner, prompts, max_new=24, chunk=32)
    assert got == [hf_generate(hf, p, 24) for p in prompts]


def test_max_model_len_past_the_models_positions_or_its_pool_is_capped_to_them(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """The engine took 1024 for a model of 512 positions: a 600-token prompt passed its checks
    and the step read past the position table (the C kernel's garbage, or an IndexError that
    failed every call of the batch)."""
    path = Path(shutil.copytree(tiny_model_dir("llama"), tmp_path / "model"))
    byte_tokenizer().save_pretrained(path)
    config = EngineConfig(model=str(path), num_blocks=128, num_threads=1, max_model_len=1024)
    core = LLMEngine(config)
    assert core.config.max_model_len == 512
    with pytest.raises(InvalidRequest, match="512"):
        core.add_request([5] * 600, SamplingParams(max_tokens=4))
    with pytest.raises(UnsupportedModel, match="512 positions"):
        ModelRunner(path, config, num_blocks=128)
    # nor past what its KV pool holds: such a request never ran, and the queue behind it waited
    small = LLMEngine(dataclasses.replace(config, num_blocks=16, block_size=16))
    assert small.config.max_model_len == 256
