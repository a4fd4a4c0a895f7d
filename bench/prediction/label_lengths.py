"""Label prompts with the serving model's own output lengths (or, for development, with the
lengths of other models' reference answers).

Engine mode runs every prompt `--samples` times through the real engine (SmolLM2-135M-Instruct,
temperature 0.7, top_p 0.9, a 512-token cap, one user turn rendered with the chat template and
its generation prompt), each sample with its own seed `crc32("<id>:<k>")`, in chunks of
`--chunk` prompts, taken in a seeded random order. Each finished chunk is appended to the labels
file at once, so a stopped run resumes where it left off and what it labelled so far is a uniform
sample of the source. Reference mode (`--reference MODEL,...`) instead takes, as
"samples", the lengths of those models' AlpacaEval answers in the serving tokenizer, capped at
512: a different model's lengths, only a stand-in until engine labels exist. `--hidden` adds a
prefill-only pass (max_tokens 1) that stores each prompt's hidden state as the engine hands it
out (engine/hidden.py; the `hidden` predictor's input) in `hidden_<source>.npz` beside the labels.
Invariant: a labels file never holds a prompt twice, and holds no prompt text.

    python -m bench.prediction.label_lengths --source alpaca_eval --samples 4 --hidden
"""

from __future__ import annotations

import argparse
import json
import random
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.paths import add_data_flag
from bench.prediction.labels import LabelRow, read_labels, write_hidden, write_labels
from bench.prediction.sources import ALPACA_RESULTS, Prompt, load_source
from predictor.prompt_model import DEFAULT_ARTIFACT

MAX_TOKENS = 512
TEMPERATURE = 0.7
TOP_P = 0.9
GENERATOR = "SmolLM2-135M-Instruct"


def render(tokenizer: Any, text: str) -> list[int]:
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(chat, add_special_tokens=False))


def sample_seed(prompt_id: str, k: int) -> int:
    return zlib.crc32(f"{prompt_id}:{k}".encode())


def label_with_engine(
    llm: Any, prompts: Sequence[Prompt], samples: int, max_model_len: int
) -> tuple[list[LabelRow], int]:
    """Run each prompt `samples` times; returns the rows and how many prompts were too long."""
    from engine import SamplingParams

    rendered = [(p, render(llm.tokenizer, p.text)) for p in prompts]
    fits = [(p, ids) for p, ids in rendered if len(ids) + MAX_TOKENS <= max_model_len]
    batch = [ids for _, ids in fits for _ in range(samples)]
    params = [
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=TEMPERATURE,
            top_p=TOP_P,
            seed=sample_seed(p.prompt_id, k),
        )
        for p, _ in fits
        for k in range(samples)
    ]
    done = llm.generate(batch, params)
    rows = [
        LabelRow(
            p.prompt_id,
            len(ids),
            tuple(r.num_output_tokens for r in done[i * samples : (i + 1) * samples]),
            MAX_TOKENS,
            GENERATOR,
        )
        for i, (p, ids) in enumerate(fits)
    ]
    return rows, len(prompts) - len(fits)


def prompt_hidden(
    llm: Any, prompts: Sequence[Prompt], max_model_len: int
) -> dict[str, list[float]]:
    """Each prompt's hidden state (engine/hidden.py), from a one-token run."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=1, return_hidden=True)
    owner = {}
    for p in prompts:
        ids = render(llm.tokenizer, p.text)
        if len(ids) + MAX_TOKENS <= max_model_len:
            owner[llm.add_request(ids, params, detokenize=False)] = p.prompt_id
    vectors: dict[str, list[float]] = {}
    while llm.has_unfinished:
        for out in llm.step():
            if out.hidden is not None:
                vectors[owner[out.request_id]] = out.hidden
    return vectors


def label_with_references(
    tokenizer: Any, prompts: Sequence[Prompt], data_dir: Path, models: Sequence[str]
) -> list[LabelRow]:
    """Stand-in labels: other models' AlpacaEval answer lengths in the serving tokenizer."""
    answers: dict[str, list[str]] = {}
    for model in models:
        path = data_dir / ALPACA_RESULTS / model / "model_outputs.json"
        for row in json.loads(path.read_text(encoding="utf-8")):
            answers.setdefault(str(row["instruction"]), []).append(str(row["output"]))
    rows = []
    for p in prompts:
        outputs = answers.get(p.text, [])
        if len(outputs) != len(models):
            continue
        lengths = tuple(
            min(len(tokenizer.encode(o, add_special_tokens=False)) + 1, MAX_TOKENS)  # + EOS
            for o in outputs
        )
        generator = "reference:" + ",".join(models)
        rows.append(
            LabelRow(p.prompt_id, len(render(tokenizer, p.text)), lengths, MAX_TOKENS, generator)
        )
    return rows


def default_out(source: str, reference: bool) -> Path:
    name = Path(source).stem if source.endswith(".jsonl") else source
    suffix = "_reference" if reference else ""
    return DEFAULT_ARTIFACT.parent / f"labels_{name}{suffix}.jsonl"


def hidden_out(labels_out: Path) -> Path:
    """`.../labels_X.jsonl` -> `.../hidden_X.npz`."""
    return labels_out.with_name(labels_out.stem.replace("labels_", "hidden_", 1) + ".npz")


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    prompts = load_source(args.source, args.data, args.n, args.seed)[: args.limit]
    out: Path = args.out or default_out(args.source, bool(args.reference))
    done_rows = read_labels(out) if out.is_file() else []
    done = {r.prompt_id for r in done_rows}
    todo = [p for p in prompts if p.prompt_id not in done]
    random.Random(args.seed).shuffle(todo)  # a stopped run's labels are a uniform sample
    print(f"{len(prompts)} prompts, {len(done)} already labelled in {out}, {len(todo)} to go")
    if args.reference:
        from engine.loader import load_tokenizer, resolve_model

        rows = label_with_references(
            load_tokenizer(resolve_model("default")), todo, args.data, args.reference.split(",")
        )
        write_labels(out, [*done_rows, *rows])
        print(f"wrote {len(rows)} reference-labelled prompts to {out}")
        return
    if todo or args.hidden:
        _run_engine(args, prompts, todo, done_rows, out)


def _run_engine(
    args: argparse.Namespace,
    prompts: Sequence[Prompt],
    todo: Sequence[Prompt],
    rows: list[LabelRow],
    out: Path,
) -> None:
    from engine import EngineConfig, LLMEngine

    config = EngineConfig(
        model="default",
        dtype=args.dtype,
        num_threads=args.threads,
        kv_cache_bytes=int(args.kv_gib * 2**30),
    )
    llm = LLMEngine(config)
    if args.hidden:
        vectors = prompt_hidden(llm, prompts, llm.config.max_model_len)
        write_hidden(hidden_out(out), vectors)
        print(f"wrote {len(vectors)} hidden vectors to {hidden_out(out)}")
    label_in_chunks(llm, todo, rows, out, args.samples, args.chunk)


def label_in_chunks(
    llm: Any, todo: Sequence[Prompt], rows: list[LabelRow], out: Path, samples: int, chunk: int
) -> None:
    """Label `todo` chunk by chunk, rewriting `out` with `rows` plus the new rows each time."""
    skipped = 0
    for start in range(0, len(todo), chunk):
        began = time.perf_counter()
        chunk_rows, too_long = label_with_engine(
            llm, todo[start : start + chunk], samples, llm.config.max_model_len
        )
        rows.extend(chunk_rows)
        skipped += too_long
        write_labels(out, rows)
        done = min(start + chunk, len(todo))
        seconds = time.perf_counter() - began
        print(f"{done}/{len(todo)} prompts ({seconds:.1f} s for this chunk, {skipped} too long)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prediction.label_lengths", description=__doc__
    )
    parser.add_argument(
        "--source", default="alpaca_eval", help="alpaca_eval, gpteacher or FILE.jsonl"
    )
    add_data_flag(parser)
    parser.add_argument("--n", type=int, default=500, help="gpteacher sample size")
    parser.add_argument("--seed", type=int, default=0, help="gpteacher sample and labelling order")
    parser.add_argument("--limit", type=int, default=None, help="label only the first N prompts")
    parser.add_argument("--samples", type=int, default=4, help="sampled answers per prompt")
    parser.add_argument("--chunk", type=int, default=16, help="prompts per engine batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--kv-gib", type=float, default=4.0, help="KV cache; a chunk's samples should all fit"
    )
    parser.add_argument("--dtype", default="float32", help="the serving dtype by default")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reference", default="", help="MODEL,...: AlpacaEval answers' lengths")
    parser.add_argument("--hidden", action="store_true", help="also store hidden states")
    return parser


if __name__ == "__main__":
    main()
