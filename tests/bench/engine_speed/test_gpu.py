"""The GPU script's whole path on a tiny random model (on CPU here, on CUDA where present)."""

import torch

from bench.engine_speed.gpu import run_model


def test_tiny_model_decodes_and_reports_a_roofline_fraction() -> None:
    rows = run_model(
        "tiny", torch.device("cpu"), [1, 3], prompt_len=16, decode_steps=6, bandwidth=10e9
    )
    assert [r["batch"] for r in rows] == [1, 3]
    for row in rows:
        assert row["decode_tok_s"] > 0 and row["roofline_fraction"] > 0
        assert row["params"] > 100_000
