"""The paged KV pool: per layer, fixed-size blocks of keys and values addressed by block id.

Layout per layer: keys [num_blocks, kv_heads, head_dim, block_size] (transposed inside a block, so
the CPU kernel scores a whole block with one vector per head dim) and values [num_blocks, kv_heads,
block_size, head_dim]. The token at position p of a sequence whose block table is B lives in block
B[p // block_size] at offset p % block_size. Invariant: the pool is allocated once, zero-filled
(stale or padding slots hold finite numbers), and a step writes only the slots its tokens own.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig


def head_dim_of(model_config: PretrainedConfig) -> int:
    head_dim = getattr(model_config, "head_dim", None)
    return int(head_dim or model_config.hidden_size // model_config.num_attention_heads)


def kv_bytes_per_block(
    model_config: PretrainedConfig, block_size: int, dtype: torch.dtype | str
) -> int:
    """Bytes one block takes across all layers (keys and values): divide the KV budget by this."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    assert isinstance(dtype, torch.dtype)
    per_token = 2 * int(model_config.num_key_value_heads) * head_dim_of(model_config)
    return int(model_config.num_hidden_layers) * per_token * block_size * dtype.itemsize


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_heads = kv_heads
        keys = torch.zeros(
            num_layers, num_blocks, kv_heads, head_dim, block_size, dtype=dtype, device=device
        )
        values = torch.zeros(
            num_layers, num_blocks, kv_heads, block_size, head_dim, dtype=dtype, device=device
        )
        self.keys = list(keys.unbind(0))
        self.values = list(values.unbind(0))

    def write(
        self,
        layer: int,
        k: torch.Tensor,  # [T, KH, D]
        v: torch.Tensor,  # [T, KH, D]
        blocks: torch.Tensor,  # [T] block id of each token
        offsets: torch.Tensor,  # [T] offset of each token inside its block
    ) -> None:
        self.keys[layer][blocks, :, :, offsets] = k
        self.values[layer][blocks, :, offsets] = v

    def gather(
        self, layer: int, block_ids: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [KH, length, D] of the first `length` positions of one block table."""
        keys = self.keys[layer].index_select(0, block_ids)  # [n, KH, D, BS]
        values = self.values[layer].index_select(0, block_ids)  # [n, KH, BS, D]
        kv_heads, head_dim = keys.shape[1], keys.shape[2]
        k = keys.permute(1, 0, 3, 2).reshape(kv_heads, -1, head_dim)[:, :length]
        v = values.transpose(0, 1).reshape(kv_heads, -1, head_dim)[:, :length]
        return k, v
