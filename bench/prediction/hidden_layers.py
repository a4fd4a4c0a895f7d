"""Which prefill hidden state predicts the serving model's output length best.

For every labelled AlpacaEval prompt, one transformers forward pass of the default model (fp32)
gives the residual stream at every layer; three representations per layer are compared: the
prompt's last token, the plain mean over the prompt's tokens, and the mean weighted by each
position's next-token entropy (EGTP). For each, a ridge regression of `log1p` of the mean
sampled length (the point model's target in `bench.prediction.training`), its penalty chosen by
5-fold cross-validated Kendall's tau on the training split, is scored by tau against the median
sampled length on the held-out prompts (split by prompt id, as everywhere). The engine's
`hidden_layer` (engine/hidden.py) is the layer with the best cross-validated tau in this sweep.
About 12 minutes on 2 cores.

    python -m bench.prediction.hidden_layers --json bench/out/hidden-layers.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.paths import add_data_flag
from bench.prediction.labels import is_held_out, read_labels
from bench.prediction.metrics import kendall_tau
from bench.prediction.sources import resolve
from predictor.prompt_model import DEFAULT_ARTIFACT

LABELS = DEFAULT_ARTIFACT.parent / "labels_alpaca_eval.jsonl"
PENALTIES = (100.0, 300.0, 1000.0, 3000.0, 10000.0)
KINDS = ("last", "mean", "egtp")


def fit_ridge(x: np.ndarray, y: np.ndarray, penalty: float) -> Callable[[np.ndarray], np.ndarray]:
    """Ridge on standardised columns with an unpenalised intercept; returns the predictor."""
    centre, spread = x.mean(axis=0), x.std(axis=0) + 1e-6
    z = (x - centre) / spread
    weights = np.linalg.solve(z.T @ z + penalty * np.eye(z.shape[1]), z.T @ (y - y.mean()))
    return lambda new: ((new - centre) / spread) @ weights + y.mean()


def cv_tau(
    x: np.ndarray, y: np.ndarray, medians: np.ndarray, penalty: float, folds: int = 5
) -> float:
    """Out-of-fold Kendall tau of ridge predictions against the medians (seeded folds)."""
    order = np.random.default_rng(0).permutation(len(y))
    predicted = np.zeros(len(y))
    for fold in range(folds):
        test = order[fold::folds]
        train = np.setdiff1d(order, test)
        predicted[test] = fit_ridge(x[train], y[train], penalty)(x[test])
    return kendall_tau(list(predicted), list(medians))


def score(x: np.ndarray, y: np.ndarray, medians: np.ndarray, held: np.ndarray) -> dict[str, float]:
    """CV tau on the training rows (best penalty) and held-out tau of the fit with it."""
    train = ~held
    tau, penalty = max((cv_tau(x[train], y[train], medians[train], p), p) for p in PENALTIES)
    fitted = fit_ridge(x[train], y[train], penalty)
    held_out = kendall_tau(list(fitted(x[held])), list(medians[held]))
    return {"cv_tau": tau, "penalty": penalty, "held_out_tau": held_out}


def representations(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """[prompts, layers + 1, hidden] per kind, from the default model's forward passes."""
    import torch
    from transformers import AutoModelForCausalLM

    from bench.prediction.label_lengths import render
    from engine.loader import load_tokenizer, resolve_model

    path = resolve_model("default")
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # eval mode
    out: dict[str, list[np.ndarray]] = {kind: [] for kind in KINDS}
    with torch.inference_mode():
        for text in texts:
            result = model(torch.tensor([render(tokenizer, text)]), output_hidden_states=True)
            states = torch.stack(result.hidden_states)[:, 0]  # [layers + 1, tokens, hidden]
            logp = torch.log_softmax(result.logits[0].float(), dim=-1)
            entropy = -(logp.exp() * logp).sum(-1)
            out["last"].append(states[:, -1].numpy())
            out["mean"].append(states.mean(dim=1).numpy())
            out["egtp"].append(torch.einsum("t,lth->lh", entropy / entropy.sum(), states).numpy())
    return {kind: np.stack(rows) for kind, rows in out.items()}


def sweep(labels: Path, data_dir: Path) -> dict[str, Any]:
    rows = read_labels(labels)
    texts = resolve((r.prompt_id for r in rows), data_dir)
    reps = representations([texts[r.prompt_id] for r in rows])
    y = np.array([np.log1p(np.mean(r.lengths)) for r in rows])
    medians = np.array([float(np.median(r.lengths)) for r in rows])
    held = np.array([is_held_out(r.prompt_id) for r in rows])
    results: dict[str, Any] = {"prompts": len(rows), "held_out": int(held.sum())}
    for kind, rep in reps.items():
        results[kind] = {}
        for layer in range(1, rep.shape[1]):
            results[kind][layer] = score(rep[:, layer], y, medians, held)
            line = results[kind][layer]
            print(
                f"{kind:5s} layer {layer:2d}: CV tau {line['cv_tau']:.3f}, "
                f"held-out tau {line['held_out_tau']:.3f}",
                file=sys.stderr,
                flush=True,
            )
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prediction.hidden_layers", description=__doc__
    )
    parser.add_argument("--labels", type=Path, default=LABELS)
    add_data_flag(parser)
    parser.add_argument("--json", type=Path, help="write the sweep here")
    args = parser.parse_args(argv)
    results = sweep(args.labels, args.data)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
