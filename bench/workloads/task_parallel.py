"""Task-parallel jobs with call lengths drawn from the Azure 2023 and Mooncake traces.

Shapes (widths are not in any trace: they are drawn log-uniformly, `2**U(1, log2 w_max)`, so a
few jobs are wide and most narrow):
- `chat`: one call, an Azure conversation row; `code`: one call, an Azure code row;
- `map_reduce`: summarise k document chunks (Mooncake rows: long inputs) in parallel, then one
  reduce call over the k summaries (prompt: their outputs plus an instruction; output: an Azure
  conversation row's), k up to 32;
- `sample_vote`: n samples of one prompt (an Azure conversation row's input; each sample's output
  an independent draw of that trace's outputs), then a vote call reading them all (output: an
  Azure code row's, mostly short), n in 3..8;
- `plan_execute`: a plan call (Azure conversation row), k execute calls (prompt: the plan's
  output plus an Azure code row's input; output: that row's output), then a call that combines
  the results, k up to 16;
- `chain`: k calls one after another (the first an Azure conversation row; each next one's
  prompt is the previous output plus an Azure code row's input, its output that row's), k up
  to 8; `short_chain`: exactly 2;
- `wide_map_reduce`: `map_reduce` with k up to 64; `small_map_reduce`: exactly 3 maps.
Prompts of Azure rows are kept (their window is the serving model's order of size); Mooncake
prompts are scaled by `context / 131_072` (Kimi's window). Every call is then fitted with
`fit_to_context`. Invariant: every job is a valid DAG; draws come only from the given rng.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from bench.paths import existing
from bench.workloads.format import Node
from bench.workloads.lengths import fit_to_context

AZURE_CONV = Path("traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
AZURE_CODE = Path("traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv")
MOONCAKE = Path("traces/mooncake/conversation_trace.jsonl")
MOONCAKE_CONTEXT = 131_072
INSTRUCTION_TOKENS = 64  # the fixed text around the parents' outputs in a join prompt

Rows = np.ndarray  # shape (n, 2): prompt tokens, output tokens


@dataclass(frozen=True, slots=True)
class TraceLengths:
    conv: Rows
    code: Rows
    mooncake: Rows  # prompts already scaled to the context
    context: int


def _csv_rows(path: Path) -> Rows:
    with existing(path).open(newline="", encoding="utf-8") as f:
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
    return np.asarray(rows, dtype=np.int64)


def load_trace_lengths(data_dir: Path, context: int) -> TraceLengths:
    with existing(data_dir / MOONCAKE).open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    scale = context / MOONCAKE_CONTEXT
    mooncake = np.asarray(
        [(round(r["input_length"] * scale), r["output_length"]) for r in rows], dtype=np.int64
    )
    conv, code = _csv_rows(data_dir / AZURE_CONV), _csv_rows(data_dir / AZURE_CODE)
    return TraceLengths(conv, code, mooncake, context)


def _row(rng: np.random.Generator, rows: Rows) -> tuple[int, int]:
    prompt, output = rows[rng.integers(len(rows))]
    return int(prompt), int(output)


def _width(rng: np.random.Generator, widest: int) -> int:
    return round(2 ** rng.uniform(1.0, math.log2(widest)))


def _count(rng: np.random.Generator, fixed: int | None, widest: int) -> int:
    """`fixed` when given, else a log-uniform width up to `widest`."""
    return fixed if fixed is not None else _width(rng, widest)


def _node(node_id: str, parents: tuple[str, ...], prompt: int, output: int, context: int) -> Node:
    fitted_prompt, fitted_output, max_tokens = fit_to_context(prompt, output, context)
    return Node(node_id, parents, fitted_prompt, fitted_output, max_tokens)


def chat_job(rng: np.random.Generator, lengths: TraceLengths) -> tuple[Node, ...]:
    return (_node("chat", (), *_row(rng, lengths.conv), lengths.context),)


def code_job(rng: np.random.Generator, lengths: TraceLengths) -> tuple[Node, ...]:
    return (_node("code", (), *_row(rng, lengths.code), lengths.context),)


def _join(node_id: str, parents: list[Node], output: int, context: int) -> Node:
    prompt = INSTRUCTION_TOKENS + sum(p.output_tokens for p in parents)
    return _node(node_id, tuple(p.node_id for p in parents), prompt, output, context)


def map_reduce_job(
    rng: np.random.Generator, lengths: TraceLengths, widest: int = 32, maps: int | None = None
) -> tuple[Node, ...]:
    mapped = [
        _node(f"map{i}", (), *_row(rng, lengths.mooncake), lengths.context)
        for i in range(_count(rng, maps, widest))
    ]
    reduce = _join("reduce", mapped, _row(rng, lengths.conv)[1], lengths.context)
    return (*mapped, reduce)


def sample_vote_job(rng: np.random.Generator, lengths: TraceLengths) -> tuple[Node, ...]:
    prompt, _ = _row(rng, lengths.conv)
    samples = [
        _node(f"sample{i}", (), prompt, _row(rng, lengths.conv)[1], lengths.context)
        for i in range(int(rng.integers(3, 9)))
    ]
    vote = _join("vote", samples, _row(rng, lengths.code)[1], lengths.context)
    return (*samples, vote)


def plan_execute_job(rng: np.random.Generator, lengths: TraceLengths) -> tuple[Node, ...]:
    plan = _node("plan", (), *_row(rng, lengths.conv), lengths.context)
    steps = []
    for i in range(_width(rng, 16)):
        prompt, output = _row(rng, lengths.code)
        steps.append(
            _node(f"exec{i}", ("plan",), plan.output_tokens + prompt, output, lengths.context)
        )
    combine = _join("combine", steps, _row(rng, lengths.conv)[1], lengths.context)
    return (plan, *steps, combine)


def chain_job(
    rng: np.random.Generator, lengths: TraceLengths, deepest: int = 8, depth: int | None = None
) -> tuple[Node, ...]:
    calls = [_node("step0", (), *_row(rng, lengths.conv), lengths.context)]
    for i in range(1, _count(rng, depth, deepest)):
        prompt, output = _row(rng, lengths.code)
        previous = calls[-1]
        calls.append(
            _node(
                f"step{i}",
                (previous.node_id,),
                previous.output_tokens + prompt,
                output,
                lengths.context,
            )
        )
    return tuple(calls)


JobMaker = Callable[[np.random.Generator, TraceLengths], tuple[Node, ...]]

TASK_KINDS: dict[str, JobMaker] = {
    "chat": chat_job,
    "code": code_job,
    "map_reduce": map_reduce_job,
    "sample_vote": sample_vote_job,
    "plan_execute": plan_execute_job,
    "chain": chain_job,
    "short_chain": partial(chain_job, depth=2),
    "wide_map_reduce": partial(map_reduce_job, widest=64),
    "small_map_reduce": partial(map_reduce_job, maps=3),
}
