"""Builders shared by the gateway tests."""

from __future__ import annotations

import numpy as np

from gateway.backends import BackendCapacity
from predictor.features import DENSE_NAMES, HASH_DIM
from predictor.prompt_model import QUANTILES, PromptModel

HIDDEN_SIZE = 4


def hidden_refiner() -> PromptModel:
    """A `hidden` model that reads only the hidden state: mu = 1 + 3 h[0] (log1p tokens), each
    quantile expm1(mu); the prompt's features weigh nothing."""
    return PromptModel(
        dense_weights=np.zeros(len(DENSE_NAMES)),
        hash_weights=np.zeros(HASH_DIM),
        bias=1.0,
        heads=np.array([[0.0, 1.0]] * len(QUANTILES)),
        meta={},
        hidden_weights=np.array([3.0] + [0.0] * (HIDDEN_SIZE - 1)),
        hidden_mean=np.zeros(HIDDEN_SIZE),
    )


def room(
    free_slots: int = 8,
    running: int = 0,
    free_blocks: int = 100,
    waiting: int = 0,
    healthy: bool = True,
    knee: int | None = None,
) -> BackendCapacity:
    """A backend's capacity snapshot: blocks of 16 tokens, `knee` its measured knee."""
    return BackendCapacity(free_blocks, 16, free_slots, running, waiting, healthy, knee_calls=knee)
