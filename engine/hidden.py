"""The prefill hidden state a call hands out for the `hidden` length predictor.

What: the residual stream of the prompt's last token after `hidden_layer(L)` of the model's L
blocks (transformers' `hidden_states[layer]` for that token), read during the prefill chunk that
samples the first output token. Why this one: on the 805 AlpacaEval prompts labelled by the
serving model, a ridge model over it ranks output lengths far better than the final layer's
entropy-weighted mean over all prompt tokens (EGTP, arXiv 2602.11812), and it costs one row
copy instead of full-vocabulary logits for every prompt token (docs/BENCHMARKS.md, "Predictor",
has the layer sweep). Invariant: nothing is held across steps, so preemption and frees need no
clean-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HIDDEN_DEPTH = 0.7  # the tapped layer as a fraction of the model's depth (21 of SmolLM2's 30)


def hidden_layer(num_layers: int) -> int:
    """The block after which the hidden state is read (1-based, as `hidden_states` counts)."""
    return min(num_layers, max(1, round(HIDDEN_DEPTH * num_layers)))


@dataclass(slots=True)
class LayerTap:
    """Rows of the residual stream to copy out after block `layer` of a forward pass."""

    layer: int  # 1-based: the state after `layer` blocks
    rows: torch.Tensor  # packed row indices
    states: torch.Tensor | None = None  # [len(rows), hidden], filled by the forward pass
