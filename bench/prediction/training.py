"""Offline training of the prompt model from length labels.

Point model: ridge regression of a prompt's central log length, `log1p` of the mean of its
sampled lengths (its expected length, what KV cost follows; it ranks better out of fold than
the mean of `log1p`: tau 0.360 against 0.358 for `prompt`, 0.534 against 0.525 with `hidden`),
on standardised dense features, hashed n-grams (scaled by `hash_scale`), for the `hidden`
variant the standardised hidden state of the prompt (scaled by `hidden_scale`), and a large
constant column that carries an almost unpenalised intercept, solved by LSQR. The ridge
strength and the scales are chosen by k-fold cross-validation *by prompt* for Kendall's tau.
Quantile heads: for each level q in (0.5, 0.9, 0.99), `log1p(length) ~ a_q + b_q * mu(x)` fitted
by pinball loss on every individual sample against the out-of-fold point `mu(x)`, so the
spread learnt is the honest spread on unseen prompts; the head's value is clipped at the cap the
samples were generated under (the labels are censored there), and (a, b) is the grid point
(slopes x quantiles of the residuals) with the lowest loss.
Invariant: no prompt's samples ever fit the point model that predicts its out-of-fold `mu`.

    python -m bench.prediction.training train --labels predictor/artifacts/labels_alpaca_eval.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.paths import add_data_flag
from bench.prediction.errors import NotEnoughData
from bench.prediction.labels import LabelRow, is_held_out, read_hidden, read_labels
from bench.prediction.metrics import kendall_tau
from bench.prediction.sources import jsonl_prompts, resolve
from predictor.features import DENSE_NAMES, HASH_DIM, PromptFeatures, extract
from predictor.prompt_model import DEFAULT_ARTIFACT, QUANTILES, PromptModel

DAMPS = (0.3, 1.0, 3.0)
HASH_SCALES = (0.0, 1.0, 3.0)
HIDDEN_SCALES = (0.1, 0.3, 1.0)
SLOPES = np.linspace(0.0, 6.0, 241)
INTERCEPT_LEVELS = np.linspace(0.0, 1.0, 201)  # intercepts tried: these quantiles of residuals
_CONSTANT = 30.0  # value of the intercept column: its weight is tiny, so ridge barely shrinks it


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    prompt_tokens: int
    lengths: tuple[int, ...]
    hidden: tuple[float, ...] = ()  # the prompt's hidden state, for the hidden variant
    max_tokens: int | None = None  # the cap the samples were generated under (None: no cap)


@dataclass(frozen=True, slots=True)
class TrainReport:
    damp: float
    hash_scale: float
    hidden_scale: float  # 0 without hidden vectors
    cv_tau: dict[str, float]  # "damp/hash_scale/hidden_scale" -> out-of-fold Kendall tau
    num_prompts: int
    num_samples: int


def training_examples(
    label_paths: Sequence[Path],
    data_dir: Path,
    *,
    prompt_files: Sequence[Path] = (),
    hidden_files: Sequence[Path] = (),
    include_held_out: bool = False,
) -> tuple[list[Example], str]:
    """Labelled prompts joined to their texts (from the built-in sources or `prompt_files`)
    and, given `hidden_files`, to their hidden vectors (prompts without one are left out);
    held-out prompts are left out unless asked. Also a description of the labels."""
    rows = [row for path in label_paths for row in read_labels(path)]
    rows = [r for r in rows if include_held_out or not is_held_out(r.prompt_id)]
    vectors = {k: v for path in hidden_files for k, v in read_hidden(path).items()}
    if hidden_files:
        rows = [r for r in rows if r.prompt_id in vectors]
    extra = [p for path in prompt_files for p in jsonl_prompts(path)]
    texts = resolve((r.prompt_id for r in rows), data_dir, extra)
    generators = sorted({r.generator for r in rows})
    sources = "; ".join(f"{p.name}" for p in label_paths) + " by " + ", ".join(generators)
    return examples_for(rows, texts, vectors), sources


def examples_for(
    rows: Sequence[LabelRow],
    texts: Mapping[str, str],
    vectors: Mapping[str, tuple[float, ...]] | None = None,
) -> list[Example]:
    """Label rows joined to their texts and, where `vectors` holds one, their hidden states."""
    return [
        Example(
            texts[r.prompt_id],
            r.prompt_tokens,
            r.lengths,
            (vectors or {}).get(r.prompt_id, ()),
            r.max_tokens,
        )
        for r in rows
    ]


def train(
    examples: Sequence[Example],
    *,
    damps: Sequence[float] = DAMPS,
    hash_scales: Sequence[float] = HASH_SCALES,
    hidden_scales: Sequence[float] = HIDDEN_SCALES,
    folds: int = 5,
    seed: int = 0,
    meta: dict[str, str] | None = None,
) -> tuple[PromptModel, TrainReport]:
    """Fit on `examples`; with hidden vectors on every example, the hidden variant."""
    if len(examples) < 2 * folds:
        raise NotEnoughData(f"need at least {2 * folds} labelled prompts, got {len(examples)}")
    feats = [extract(e.text, e.prompt_tokens) for e in examples]
    hidden = np.array([e.hidden for e in examples], dtype=np.float64)
    if hidden.ndim != 2 or hidden.shape[1] == 0:
        hidden, hidden_scales = np.zeros((len(examples), 0)), (0.0,)
    dense = np.hstack([np.array([f.dense for f in feats]), hidden])
    mean, scale = dense.mean(axis=0), dense.std(axis=0)
    scale[scale < 1e-8] = 1.0  # (near-)constant columns: leave them unscaled, not blown up
    target = np.array([np.log1p(np.mean(e.lengths)) for e in examples])
    medians = [float(np.median(e.lengths)) for e in examples]
    fold_of = np.random.default_rng(seed).permutation(len(examples)) % folds
    cv_tau, best, best_oof = {}, (-2.0, 0.0, 0.0, 0.0), np.zeros(len(examples))
    for damp, hash_scale, hidden_scale in itertools.product(damps, hash_scales, hidden_scales):
        design = _design(feats, (dense - mean) / scale, hash_scale, hidden_scale)
        oof = _out_of_fold(design, target, fold_of, damp)
        tau = kendall_tau(list(oof), medians)
        cv_tau[f"{damp:g}/{hash_scale:g}/{hidden_scale:g}"] = tau
        if tau > best[0]:
            best, best_oof = (tau, damp, hash_scale, hidden_scale), oof
    _, damp, hash_scale, hidden_scale = best
    coef = _ridge(_design(feats, (dense - mean) / scale, hash_scale, hidden_scale), target, damp)
    heads = tuple(_quantile_head(best_oof, examples, q) for q in QUANTILES)
    scales = np.concatenate([np.ones(len(DENSE_NAMES)), np.full(hidden.shape[1], hidden_scale)])
    model = _fold_standardisation(coef, mean, scale / scales, hash_scale, heads, meta or {})
    num_samples = sum(len(e.lengths) for e in examples)
    report = TrainReport(damp, hash_scale, hidden_scale, cv_tau, len(examples), num_samples)
    return model, report


def _design(
    feats: Sequence[PromptFeatures], standard: np.ndarray, hash_scale: float, hidden_scale: float
) -> object:
    """[standardised dense | hidden * hidden_scale | hashed * hash_scale | constant]."""
    from scipy import sparse

    k = len(DENSE_NAMES)
    dense = np.hstack([standard[:, :k], standard[:, k:] * hidden_scale])
    rows = np.repeat(np.arange(len(feats)), [len(f.hashed) for f in feats])
    cols = np.concatenate([np.asarray(f.hashed, dtype=np.int64) for f in feats])
    vals = np.repeat([f.hashed_value * hash_scale for f in feats], [len(f.hashed) for f in feats])
    hashed = sparse.csr_matrix((vals, (rows, cols)), shape=(len(feats), HASH_DIM))
    constant = np.full((len(feats), 1), _CONSTANT)
    return sparse.hstack([sparse.csr_matrix(dense), hashed, constant], format="csr")


def _ridge(design: object, target: np.ndarray, damp: float) -> np.ndarray:
    from scipy.sparse.linalg import lsqr

    coef: np.ndarray = lsqr(design, target, damp=damp, atol=1e-10, btol=1e-10)[0]
    return coef


def _out_of_fold(
    design: object, target: np.ndarray, fold_of: np.ndarray, damp: float
) -> np.ndarray:
    matrix = design  # scipy sparse matrices are untyped here
    oof = np.zeros(len(target))
    for fold in np.unique(fold_of):
        train, test = fold_of != fold, fold_of == fold
        coef = _ridge(matrix[train], target[train], damp)  # type: ignore[index]
        oof[test] = matrix[test] @ coef  # type: ignore[index]
    return oof


def _quantile_head(mu: np.ndarray, examples: Sequence[Example], q: float) -> tuple[float, float]:
    """(a, b) minimising the pinball loss of `min(a + b * mu, log1p(cap))` over every sample.

    The clip is part of the fit because labels are censored at the cap (about 30 % of the
    serving model's samples end there): fitted without it, any share of capped samples above
    1 - q makes a constant at the cap the best head, the same for every prompt.
    """
    counts = [len(e.lengths) for e in examples]
    z = np.repeat(mu, counts)
    y = np.log1p(np.concatenate([np.asarray(e.lengths, dtype=np.float64) for e in examples]))
    caps = np.repeat([math.inf if e.max_tokens is None else e.max_tokens for e in examples], counts)
    ceiling = np.log1p(caps)
    best = (math.inf, 0.0, 0.0)
    for slope in SLOPES:
        residual = y - slope * z
        intercepts = np.quantile(residual, INTERCEPT_LEVELS)
        pred = np.minimum(intercepts[:, None] + slope * z[None, :], ceiling[None, :])
        err = y[None, :] - pred
        loss = np.mean(np.maximum(q * err, (q - 1) * err), axis=1)
        i = int(np.argmin(loss))
        if loss[i] < best[0]:
            best = (float(loss[i]), float(intercepts[i]), float(slope))
    return best[1], best[2]


def _fold_standardisation(
    coef: np.ndarray,
    mean: np.ndarray,
    scale: np.ndarray,
    hash_scale: float,
    heads: tuple[tuple[float, float], ...],
    meta: dict[str, str],
) -> PromptModel:
    """Weights on raw features: dense and hidden columns were `(x - mean) / scale`.

    The dense features' means go into the bias; the hidden means stay apart, so a prediction
    without a hidden vector is the one at the training mean vector.
    """
    k, width = len(DENSE_NAMES), len(mean)
    weights = coef[:width] / scale
    bias = float(coef[-1] * _CONSTANT - np.dot(weights[:k], mean[:k]))
    hash_w = coef[width : width + HASH_DIM] * hash_scale
    assert math.isfinite(bias), "ridge produced a non-finite intercept"
    return PromptModel(weights[:k], hash_w, bias, np.array(heads), meta, weights[k:], mean[k:])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prediction.training")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("train", help="fit the prompt model on the training split of labels")
    cmd.add_argument("--labels", type=Path, action="append", required=True)
    add_data_flag(cmd)
    cmd.add_argument("--prompts", type=Path, action="append", default=[], help="JSONL prompts")
    cmd.add_argument(
        "--hidden", type=Path, action="append", default=[], help="hidden states (.npz)"
    )
    cmd.add_argument("--out", type=Path, default=DEFAULT_ARTIFACT)
    cmd.add_argument("--all", action="store_true", help="also train on the held-out prompts")
    cmd.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    examples, sources = training_examples(
        args.labels,
        args.data,
        prompt_files=args.prompts,
        hidden_files=args.hidden,
        include_held_out=args.all,
    )
    model, report = train(examples, seed=args.seed, meta={"labels": sources})
    model.save(args.out)
    best = f"{report.damp:g}/{report.hash_scale:g}/{report.hidden_scale:g}"
    print(
        f"trained on {report.num_prompts} prompts ({report.num_samples} samples); "
        f"damp/hash_scale/hidden_scale {best}, out-of-fold tau {report.cv_tau[best]:.3f}; "
        f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)"
    )


if __name__ == "__main__":
    main()
