"""The per-row operations of a decoder layer, as torch ops: the reference for the fused CPU kernels.

Algorithm: residual add then RMSNorm in fp32 (`x * rsqrt(mean(x^2) + eps)`, rounded to the model
dtype, times the weight), SiLU(gate) * up, and rotate-half RoPE written as
`x * cos + roll(x, D/2) * sin_folded` with the sign of rotate_half folded into the sin table.
Invariant: each op rounds where HuggingFace's Llama/Qwen2 modelling code rounds, so fp32 results
equal HF's; `CpuKernels` implements the same `RowOps` protocol with one call per op.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class RowOps(Protocol):
    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """x += delta in place (when given); returns RMSNorm(x) * weight."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for rows laid out [gate | up]."""
        ...

    def rope(
        self,
        x: torch.Tensor,
        heads: int,
        head_dim: int,
        cos: torch.Tensor,
        sin_folded: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        """Rotate the first `heads` heads of every row of x in place, by each row's position."""
        ...


class TorchRowOps:
    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        if delta is not None:
            x.add_(delta)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        inter = gate_up.shape[1] // 2
        return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]

    def rope(
        self,
        x: torch.Tensor,
        heads: int,
        head_dim: int,
        cos: torch.Tensor,
        sin_folded: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        rotated = x[:, : heads * head_dim].view(x.shape[0], heads, head_dim)
        c, s = cos[positions].unsqueeze(1), sin_folded[positions].unsqueeze(1)
        rotated.copy_(rotated * c + torch.roll(rotated, head_dim // 2, -1) * s)
