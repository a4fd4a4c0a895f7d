"""Entropy-weighted pooling of prompt hidden states (EGTP, arXiv 2602.11812).

Algorithm: for each prompt position i, the weight is the entropy H_i of the model's next-token
distribution there; the pooled vector is sum_i H_i h_i / sum_i H_i over the last layer's
(final-norm) hidden states h_i, i.e. the hidden states averaged with entropies normalised to sum to
one. Chunked prefill adds each chunk's two running sums; the chunk that samples reads the vector
out. Invariant: state is held only for requests between their first pooled chunk and their read-out
or drop, so a preempted or freed request leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

LOGITS_SLICE = 128  # rows of full-vocabulary logits alive at once


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(logits) per row, in fp32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


class HiddenPooler:
    def __init__(self) -> None:
        self._sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def add(
        self,
        request_id: str,
        hidden: torch.Tensor,  # [n, hidden] final-norm states of the chunk's tokens
        logits_of: Callable[[torch.Tensor], torch.Tensor],  # hidden rows -> logits
    ) -> None:
        entropies = torch.cat(
            [token_entropy(logits_of(part)) for part in torch.split(hidden, LOGITS_SLICE)]
        )
        weighted = entropies @ hidden.float()
        total = entropies.sum()
        if request_id in self._sums:
            prev_weighted, prev_total = self._sums[request_id]
            weighted, total = prev_weighted + weighted, prev_total + total
        self._sums[request_id] = (weighted, total)

    def pop(self, request_id: str) -> list[float]:
        weighted, total = self._sums.pop(request_id)
        pooled: list[float] = (weighted / total.clamp_min(torch.finfo(torch.float32).tiny)).tolist()
        return pooled

    def drop(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._sums.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._sums)
