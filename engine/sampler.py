"""Token choice from last-position logits: greedy, temperature, top-k, top-p, per-request seeds.

Algorithm: a row short of its min_tokens first has its stop tokens (EOS unless ignore_eos, and its
stop token ids) set to -inf, so nothing below can pick them. Greedy rows take the argmax (the whole
batch in one call when every row is greedy).
Sampled rows, in float32 and shifted so their maximum is 0, are divided by their temperature (a
shifted logit is <= 0, so even the smallest legal temperature cannot overflow it, and the top token
keeps probability >= 1 / vocab), cut to their top-k and top-p sets (top-k first, then the smallest
prefix of the sorted distribution whose mass reaches top_p, never empty, looked for among the top
256 tokens before sorting the whole row), and drawn by inverse CDF with one uniform number per
row. A seeded row's uniform comes from a generator seeded with (seed, output index), so its draw
depends only on its own logits, seed and position, never on the rest of the batch; unseeded rows
share the sampler's generator.
Invariant: a returned token always has non-zero probability under the row's filtered distribution.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.sampling import SamplingParams

_MASK64 = (1 << 64) - 1
NUCLEUS_CANDIDATES = 256  # tokens sorted for top-p before falling back to a full sort


def _mix(seed: int, index: int) -> int:
    """splitmix64 of (seed, index): well-spread generator seeds for consecutive indices."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1  # manual_seed takes a non-negative int below 2**63


def _torch_argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


class Sampler:
    def __init__(
        self,
        seed: int | None = None,
        argmax: Callable[[torch.Tensor], torch.Tensor] = _torch_argmax,  # a faster one may plug in
        eos_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        self._argmax = argmax
        self._eos = eos_token_ids
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    def __call__(
        self,
        logits: torch.Tensor,  # [N, V], any float dtype (argmax needs no upcast); masked in place
        params: list[SamplingParams],
        output_index: list[int],  # tokens each row's request has generated so far
    ) -> list[int]:
        self._mask_stops(logits, params, output_index)
        tokens = self._argmax(logits)
        if all(p.greedy for p in params):
            return tokens.tolist()
        rows = [i for i, p in enumerate(params) if not p.greedy]
        chosen = [params[i] for i in rows]
        uniforms = torch.stack([self._uniform(params[i], output_index[i]) for i in rows])
        probs = _filtered_probs(logits[rows].float(), chosen)
        tokens[rows] = _draw(probs, uniforms.to(probs.device))
        return tokens.tolist()

    def _mask_stops(
        self, logits: torch.Tensor, params: list[SamplingParams], output_index: list[int]
    ) -> None:
        """Rule out, in place, the tokens that would end a row before its min_tokens."""
        for row, (p, index) in enumerate(zip(params, output_index, strict=True)):
            if index >= p.min_tokens:
                continue
            stops = set(p.stop_token_ids) if p.ignore_eos else self._eos | set(p.stop_token_ids)
            ids = [t for t in stops if t < logits.shape[-1]]  # others can never be drawn
            if ids:
                logits[row, ids] = float("-inf")

    def _uniform(self, params: SamplingParams, index: int) -> torch.Tensor:
        if params.seed is None:
            return torch.rand((), generator=self._generator, dtype=torch.float64)
        generator = torch.Generator().manual_seed(_mix(params.seed, index))
        return torch.rand((), generator=generator, dtype=torch.float64)


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Probabilities after temperature, with tokens outside the top-k / top-p sets zeroed."""
    temps = torch.tensor([p.temperature for p in params], device=logits.device)
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # <= 0: dividing cannot overflow
    probs = torch.softmax(shifted / temps[:, None], dim=-1)
    vocab = logits.shape[-1]
    top_k = [min(p.top_k, vocab) for p in params]
    if any(k > 0 for k in top_k):
        largest = probs.topk(max(top_k), dim=-1).values
        kth = torch.tensor([max(k, 1) - 1 for k in top_k], device=logits.device)
        threshold = largest.gather(1, kth[:, None])
        threshold[torch.tensor(top_k, device=logits.device) == 0] = 0.0
        probs = torch.where(probs >= threshold, probs, 0.0)
    top_p = torch.tensor([p.top_p for p in params], device=logits.device)
    if bool((top_p < 1).any()):
        probs = _nucleus(probs, top_p[:, None] * probs.sum(-1, keepdim=True))
    return probs


def _nucleus(probs: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """Keep each row's most likely tokens while the mass before them is below `limit` [N, 1].

    Only the top NUCLEUS_CANDIDATES are sorted (a full-vocabulary sort costs more than the model's
    decode step at batch 64); a row whose nucleus reaches past them is sorted in full.
    """
    values, order = probs.topk(min(NUCLEUS_CANDIDATES, probs.shape[-1]), dim=-1)
    kept, covered = _prefix(values, limit)
    out = torch.zeros_like(probs).scatter_(1, order, kept)
    wide = (~covered).nonzero()[:, 0]
    if wide.numel():
        values, order = probs[wide].sort(dim=-1, descending=True)
        out[wide] = torch.zeros_like(values).scatter_(1, order, _prefix(values, limit[wide])[0])
    return out


def _prefix(values: torch.Tensor, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Descending `values` zeroed once the mass before them reaches `limit`; whether the
    values' own mass reached it (else the kept prefix may continue past them)."""
    cumulative = values.cumsum(-1)
    kept = torch.where(cumulative - values < limit, values, 0.0)
    kept[:, 0] = values[:, 0]  # the likeliest always: a tiny top_p is 0 in float32
    return kept, cumulative[:, -1] >= limit[:, 0]


def _draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: the first token whose cumulative mass exceeds u * total."""
    cdf = probs.double().cumsum(-1)
    targets = (uniforms * cdf[:, -1])[:, None]
    picked = torch.searchsorted(cdf, targets, right=True)[:, 0]
    return picked.clamp_(max=probs.shape[-1] - 1)
