"""Paged attention over a packed step: batch metadata from a StepPlan, and the attention itself.

Algorithm: a step's tokens are packed into one [T] row, single-token sequences (decodes) first,
then prefill chunks. Each layer writes the step's keys and values into their slots
(block_ids[pos // block_size], pos % block_size), then attends: all decode rows in one call of the
CPU paged kernel (reading pages in place; on CUDA or without the kernel, one SDPA over the pages
gathered into a padded batch), and each prefill chunk with one causal SDPA (over its own keys when
it starts at position 0, else over its pages). Invariant: a token at position p sees exactly the
positions 0..p of its own sequence.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.cpu_kernels import CpuKernels
from engine.kv_cache import KVCache
from engine.plan import ScheduledSeq


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    row: int  # first packed row of the chunk
    length: int
    start_pos: int
    block_ids: torch.Tensor  # int64, the blocks covering positions [0, start_pos + length)


@dataclass(frozen=True, slots=True)
class StepBatch:
    seq_order: list[int]  # plan index of each packed sequence: decodes first, then prefill chunks
    last_rows: list[int]  # packed row of each packed sequence's last token
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_blocks: torch.Tensor  # [T] block holding each token's KV
    slot_offsets: torch.Tensor  # [T] offset inside that block
    num_decodes: int  # rows [0, num_decodes) are single-token sequences
    decode_tables: torch.Tensor  # [num_decodes, max_blocks] int32, zero-padded
    decode_lens: torch.Tensor  # [num_decodes] int32 context length including the new token
    prefills: list[PrefillChunk]


def build_step_batch(seqs: list[ScheduledSeq], block_size: int, device: torch.device) -> StepBatch:
    """Pack a plan's sequences (decodes first) and map every token to its position and KV slot."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].token_ids) != 1)
    packed = [seqs[i] for i in order]
    num_decodes = sum(1 for s in packed if len(s.token_ids) == 1)
    lengths = [len(s.token_ids) for s in packed]
    ends = torch.tensor(lengths).cumsum(0)
    token_ids = list(itertools.chain.from_iterable(s.token_ids for s in packed))
    max_blocks = max(len(s.block_ids) for s in packed)
    tables = torch.tensor([s.block_ids + [0] * (max_blocks - len(s.block_ids)) for s in packed])
    starts = torch.tensor([s.start_pos for s in packed])
    seq_of_token = torch.repeat_interleave(torch.arange(len(packed)), torch.tensor(lengths))
    positions = torch.arange(len(token_ids)) - (ends - torch.tensor(lengths))[seq_of_token]
    positions += starts[seq_of_token]
    slot_blocks = tables[seq_of_token, positions // block_size]
    prefills, row = [], num_decodes
    for s in packed[num_decodes:]:
        used = -(-(s.start_pos + len(s.token_ids)) // block_size)
        block_ids = torch.tensor(s.block_ids[:used], device=device)
        prefills.append(PrefillChunk(row, len(s.token_ids), s.start_pos, block_ids))
        row += len(s.token_ids)
    return StepBatch(
        seq_order=order,
        last_rows=(ends - 1).tolist(),
        input_ids=torch.tensor(token_ids, device=device),
        positions=positions.to(device),
        slot_blocks=slot_blocks.to(device),
        slot_offsets=(positions % block_size).to(device),
        num_decodes=num_decodes,
        decode_tables=tables[:num_decodes].to(device=device, dtype=torch.int32),
        decode_lens=(starts[:num_decodes] + 1).to(device=device, dtype=torch.int32),
        prefills=prefills,
    )


class PagedAttention:
    """Attention for every layer of one model over one KV pool."""

    def __init__(
        self,
        cache: KVCache,
        num_heads: int,
        head_dim: int,
        kernel: CpuKernels | None,
    ) -> None:
        self.cache = cache
        self.num_heads = num_heads
        self.scale = head_dim**-0.5
        dtype, device = cache.keys[0].dtype, cache.keys[0].device
        usable = (
            kernel is not None
            and device.type == "cpu"
            and kernel.supports(dtype, cache.block_size, head_dim, num_heads, cache.kv_heads)
        )
        self.kernel = kernel if usable else None

    def __call__(
        self,
        layer: int,
        q: torch.Tensor,  # [T, H, D], heads contiguous within a row (views into qkv rows work)
        k: torch.Tensor,  # [T, KH, D], likewise
        v: torch.Tensor,  # [T, KH, D], likewise
        batch: StepBatch,
    ) -> torch.Tensor:
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        if self.kernel is not None:
            self.kernel.write(k, v, batch.slot_blocks, batch.slot_offsets, keys, values)
        else:
            self.cache.write(layer, k, v, batch.slot_blocks, batch.slot_offsets)
        out = q.new_empty(q.shape)
        n = batch.num_decodes
        if n:
            if self.kernel is not None:
                self.kernel.decode(
                    q[:n], keys, values, batch.decode_tables, batch.decode_lens, self.scale, out[:n]
                )
            else:
                out[:n] = self._decode_torch(layer, q[:n], batch)
        for chunk in batch.prefills:
            rows = slice(chunk.row, chunk.row + chunk.length)
            out[rows] = self._prefill(layer, q[rows], k[rows], v[rows], chunk)
        return out

    def _prefill(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: PrefillChunk
    ) -> torch.Tensor:
        qh = q.transpose(0, 1)
        if chunk.start_pos == 0:
            # with a batch dimension, CPU SDPA takes its flash kernel (3x faster at 512 tokens
            # than the math path that 3-D inputs with GQA get)
            o = F.scaled_dot_product_attention(
                qh[None],
                k.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                is_causal=True,
                scale=self.scale,
                enable_gqa=True,
            )
            return o[0].transpose(0, 1)
        ctx = chunk.start_pos + chunk.length
        keys, values = self.cache.gather(layer, chunk.block_ids, ctx)
        key_pos = torch.arange(ctx, device=q.device)
        query_pos = torch.arange(chunk.start_pos, ctx, device=q.device)
        mask = key_pos[None, :] <= query_pos[:, None]
        o = F.scaled_dot_product_attention(
            qh, keys, values, attn_mask=mask, scale=self.scale, enable_gqa=True
        )
        return o.transpose(0, 1)

    def _decode_torch(self, layer: int, q: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """Decode rows by one SDPA over their pages gathered into a padded batch (CUDA path)."""
        tables = batch.decode_tables.long()
        keys = self.cache.keys[layer][tables]  # [B, nb, KH, D, BS]
        values = self.cache.values[layer][tables]  # [B, nb, KH, BS, D]
        b, nb, kv_heads, head_dim, bs = keys.shape
        k = keys.permute(0, 2, 1, 4, 3).reshape(b, kv_heads, nb * bs, head_dim)
        v = values.permute(0, 2, 1, 3, 4).reshape(b, kv_heads, nb * bs, head_dim)
        mask = torch.arange(nb * bs, device=q.device)[None, :] < batch.decode_lens[:, None]
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2),
            k,
            v,
            attn_mask=mask[:, None, None, :],
            scale=self.scale,
            enable_gqa=True,
        )
        return o.squeeze(2)
