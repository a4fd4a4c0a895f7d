import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.prediction.label_lengths import (
    MAX_TOKENS,
    TEMPERATURE,
    TOP_P,
    label_in_chunks,
    label_with_engine,
    label_with_references,
    prompt_hidden,
    sample_seed,
)
from bench.prediction.labels import read_labels
from bench.prediction.sources import ALPACA_RESULTS, Prompt


class CharTokenizer:
    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any:
        assert kwargs == {"tokenize": False, "add_generation_prompt": True}
        return "".join(f"<{m['role']}>{m['content']}" for m in conversation) + "<assistant>"

    def encode(self, text: str, **kwargs: Any) -> Any:
        assert kwargs == {"add_special_tokens": False}
        return [ord(c) for c in text]


@dataclass
class FakeRequest:
    num_output_tokens: int


@dataclass
class FakeOutput:
    request_id: str
    hidden: list[float] | None


@dataclass
class FakeConfig:
    max_model_len: int


class FakeEngine:
    """Answers each request with a length drawn from its seed, and records what it was asked."""

    def __init__(self, max_model_len: int = 4096) -> None:
        self.tokenizer = CharTokenizer()
        self.config = FakeConfig(max_model_len)
        self.calls: list[tuple[list[list[int]], list[Any]]] = []
        self.pending: list[tuple[str, list[int]]] = []

    def generate(self, prompts: list[list[int]], params: list[Any]) -> list[FakeRequest]:
        self.calls.append((prompts, params))
        return [FakeRequest(1 + p.seed % MAX_TOKENS) for p in params]

    def add_request(self, prompt: list[int], params: Any, *, detokenize: bool) -> str:
        assert params.max_tokens == 1 and params.return_hidden and not detokenize
        self.pending.append((f"req-{len(self.pending)}", prompt))
        return self.pending[-1][0]

    @property
    def has_unfinished(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[FakeOutput]:
        rid, prompt = self.pending.pop(0)
        return [FakeOutput(rid, [float(len(prompt)), 1.0])]


def test_each_prompt_is_sampled_with_its_own_seeds_and_server_sampling() -> None:
    llm = FakeEngine()
    prompts = [Prompt("src:0", "hi"), Prompt("src:1", "hello there")]
    rows, too_long = label_with_engine(llm, prompts, samples=3, max_model_len=4096)
    assert too_long == 0
    ((batch, params),) = llm.calls
    assert len(batch) == 6 and batch[0] == [ord(c) for c in "<user>hi<assistant>"]
    assert {(p.max_tokens, p.temperature, p.top_p) for p in params} == {
        (MAX_TOKENS, TEMPERATURE, TOP_P)
    }
    assert [p.seed for p in params[:3]] == [sample_seed("src:0", k) for k in range(3)]
    assert sample_seed("src:0", 1) == zlib.crc32(b"src:0:1")
    assert rows[1].prompt_id == "src:1"
    assert rows[1].prompt_tokens == len("<user>hello there<assistant>")
    assert rows[1].lengths == tuple(1 + sample_seed("src:1", k) % MAX_TOKENS for k in range(3))


def test_prompts_that_cannot_fit_with_the_cap_are_skipped() -> None:
    llm = FakeEngine(max_model_len=MAX_TOKENS + 30)
    rows, too_long = label_with_engine(
        llm, [Prompt("a:0", "x"), Prompt("a:1", "y" * 40)], samples=2, max_model_len=MAX_TOKENS + 30
    )
    assert too_long == 1 and [r.prompt_id for r in rows] == ["a:0"]


def test_chunks_are_written_as_they_finish(tmp_path: Path) -> None:
    llm = FakeEngine()
    out = tmp_path / "labels.jsonl"
    prompts = [Prompt(f"s:{i}", f"zebra {i}") for i in range(5)]
    rows: list[Any] = []
    label_in_chunks(llm, prompts, rows, out, samples=2, chunk=2)
    assert len(llm.calls) == 3
    assert [r.prompt_id for r in read_labels(out)] == [f"s:{i}" for i in range(5)]
    assert "zebra" not in out.read_text()  # ids and lengths only, never the text


def test_reference_labels_count_answer_tokens_capped(tmp_path: Path) -> None:
    for model, answers in {"m1": ["ab", "x" * 600], "m2": ["abcd", "y"]}.items():
        path = tmp_path / ALPACA_RESULTS / model / "model_outputs.json"
        path.parent.mkdir(parents=True)
        outputs = [{"instruction": f"q{i}", "output": a} for i, a in enumerate(answers)]
        path.write_text(json.dumps(outputs))
    prompts = [Prompt("alpaca_eval:0", "q0"), Prompt("alpaca_eval:1", "q1"), Prompt("x:0", "nope")]
    rows = label_with_references(CharTokenizer(), prompts, tmp_path, ["m1", "m2"])
    assert [(r.prompt_id, r.lengths) for r in rows] == [
        ("alpaca_eval:0", (3, 5)),  # answer tokens + EOS
        ("alpaca_eval:1", (MAX_TOKENS, 2)),
    ]
    assert rows[0].generator == "reference:m1,m2"


def test_prompt_hidden_maps_vectors_to_prompt_ids() -> None:
    llm = FakeEngine(max_model_len=MAX_TOKENS + 40)
    prompts = [Prompt("a:0", "hi"), Prompt("a:1", "z" * 50), Prompt("a:2", "hey")]
    vectors = prompt_hidden(llm, prompts, max_model_len=MAX_TOKENS + 40)
    assert vectors == {
        "a:0": [float(len("<user>hi<assistant>")), 1.0],
        "a:2": [float(len("<user>hey<assistant>")), 1.0],
    }
