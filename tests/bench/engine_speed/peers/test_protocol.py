import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.engine_speed.peers.protocol import (
    WARMUP_REQUESTS,
    WorkerArgs,
    parse_worker_args,
    read_result,
    run_benchmark,
    worker_argv,
)
from bench.errors import WrongOutputLength


def write_workload(path: Path, lens: list[int]) -> None:
    prompts = [[i + 1] * 3 for i in range(len(lens))]
    path.write_text(json.dumps({"prompt_token_ids": prompts, "output_lens": lens}))


def test_run_benchmark_warms_up_times_reps_and_counts_useful_tokens(tmp_path: Path) -> None:
    write_workload(tmp_path / "w.json", [4, 2, 3, 1, 5])
    args = WorkerArgs("m", tmp_path / "w.json", "float32", 2, tmp_path / "r.json", 2)
    calls: list[int] = []

    def generate(prompts: Sequence[list[int]], lens: Sequence[int]) -> list[list[int]]:
        calls.append(len(prompts))
        return [[p[0]] * n for p, n in zip(prompts, lens, strict=True)]

    got = run_benchmark(args, lambda: generate)
    assert calls == [WARMUP_REQUESTS, 5, 5]
    assert read_result(args.out) == got
    assert got.tok_s == [15 / w for w in got.wall_s]
    assert got.output_token_ids[1] == [2, 2]


def test_run_benchmark_rejects_wrong_lengths(tmp_path: Path) -> None:
    write_workload(tmp_path / "w.json", [4, 2, 3, 1, 5])
    args = WorkerArgs("m", tmp_path / "w.json", "float32", 1, tmp_path / "r.json", 2)
    with pytest.raises(WrongOutputLength, match=r"\[2\]"):
        run_benchmark(
            args, lambda: lambda prompts, lens: [[0] * (n + (i == 2)) for i, n in enumerate(lens)]
        )
    assert not args.out.exists()


def test_worker_args_round_trip() -> None:
    args = WorkerArgs("default", Path("/w.json"), "bfloat16", 3, Path("/r.json"), 2)
    assert parse_worker_args(worker_argv(args)) == args
