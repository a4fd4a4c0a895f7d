"""Paged attention: step packing, the CPU decode kernel and the torch path against a reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.attention import PagedAttention, build_step_batch
from engine.cpu_kernels import load_cpu_kernels
from engine.kv_cache import KVCache
from engine.plan import ScheduledSeq
from engine.sampling import SamplingParams

BLOCK = 16
PARAMS = SamplingParams()
CONTEXT_LENS = [1, 15, 16, 17, 40, 200]


def seq(rid: str, tokens: int, start: int, blocks: list[int]) -> ScheduledSeq:
    return ScheduledSeq(rid, list(range(tokens)), start, blocks, True, PARAMS, 0)


def test_step_batch_packs_decodes_first_and_maps_slots() -> None:
    seqs = [seq("p", 20, 10, [7, 3]), seq("d", 1, 16, [5, 9]), seq("q", 3, 0, [4])]
    batch = build_step_batch(seqs, BLOCK, torch.device("cpu"))
    assert batch.seq_order == [1, 0, 2] and batch.num_decodes == 1
    assert batch.last_rows == [0, 20, 23]
    assert batch.positions.tolist() == [16, *range(10, 30), 0, 1, 2]
    want_blocks = [9] + [7] * 6 + [3] * 14 + [4] * 3
    assert batch.slot_blocks.tolist() == want_blocks
    assert batch.slot_offsets.tolist() == [p % BLOCK for p in batch.positions.tolist()]
    assert batch.decode_tables.tolist() == [[5, 9]] and batch.decode_lens.tolist() == [17]
    assert [(c.row, c.length, c.start_pos) for c in batch.prefills] == [(1, 20, 10), (21, 3, 0)]


def filled_cache(
    kv_heads: int, head_dim: int, dtype: torch.dtype, num_blocks: int = 64
) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
    """A one-layer cache holding random keys/values for positions 0..(num_blocks*BLOCK - 1)."""
    cache = KVCache(1, num_blocks, BLOCK, kv_heads, head_dim, dtype, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    slots = num_blocks * BLOCK
    k = torch.randn(slots, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(slots, kv_heads, head_dim, generator=g).to(dtype)
    cache.write(0, k, v, torch.arange(slots) // BLOCK, torch.arange(slots) % BLOCK)
    return cache, k, v


def reference_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: list[list[int]], lens: list[int]
) -> torch.Tensor:
    """Per row: gather its positions slot by slot, repeat kv heads, plain softmax attention."""
    heads, kv_heads = q.shape[1], k.shape[1]
    out = []
    for row, (table, length) in enumerate(zip(tables, lens, strict=True)):
        slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(length)])
        keys = k[slots].float().repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)
        values = v[slots].float().repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)
        scores = (keys @ q[row].float()[:, :, None])[..., 0] / q.shape[-1] ** 0.5
        out.append((F.softmax(scores, -1)[:, None, :] @ values)[:, 0])
    return torch.stack(out)


def decode_case(
    heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[PagedAttention, torch.Tensor, torch.Tensor, list[ScheduledSeq], torch.Tensor]:
    cache, k, v = filled_cache(kv_heads, head_dim, dtype)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(1)).tolist()
    seqs, used = [], 0
    for i, length in enumerate(CONTEXT_LENS):
        n = -(-length // BLOCK)
        seqs.append(seq(str(i), 1, length - 1, perm[used : used + n]))
        used += n
    q = torch.randn(len(seqs), heads, head_dim, generator=torch.Generator().manual_seed(2))
    attention = PagedAttention(cache, heads, head_dim, load_cpu_kernels())
    want = reference_decode(q, k, v, [s.block_ids for s in seqs], CONTEXT_LENS)
    return attention, q.to(dtype), k, seqs, want


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 64), (14, 2, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_and_torch_path_match_reference(
    heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    attention, q, _, seqs, want = decode_case(heads, kv_heads, head_dim, dtype)
    assert attention.kernel is not None
    batch = build_step_batch(seqs, BLOCK, torch.device("cpu"))
    out = torch.empty_like(q)
    cache = attention.cache
    attention.kernel.decode(
        q,
        cache.keys[0],
        cache.values[0],
        batch.decode_tables,
        batch.decode_lens,
        attention.scale,
        out,
    )
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(
        attention._decode_torch(0, q, batch).float(), want, atol=tol, rtol=tol
    )


def test_layer_call_writes_new_keys_then_attends_causally_within_a_chunk() -> None:
    """A chunk starting mid-sequence sees the cached prefix plus its own earlier tokens only."""
    heads, kv_heads, head_dim = 4, 2, 64
    cache, k, v = filled_cache(kv_heads, head_dim, torch.float32, num_blocks=8)
    g = torch.Generator().manual_seed(3)
    chunk_k = torch.randn(10, kv_heads, head_dim, generator=g)
    chunk_v = torch.randn(10, kv_heads, head_dim, generator=g)
    q = torch.randn(11, heads, head_dim, generator=g)
    decode = seq("d", 1, 40, [4, 5, 6])  # 41 tokens of context in blocks 4..6
    chunk = seq("c", 10, 20, [0, 1])  # positions 20..29 on top of 20 cached ones
    batch = build_step_batch([chunk, decode], BLOCK, torch.device("cpu"))
    new_k = torch.cat([torch.randn(1, kv_heads, head_dim, generator=g), chunk_k])
    new_v = torch.cat([torch.randn(1, kv_heads, head_dim, generator=g), chunk_v])
    out = PagedAttention(cache, heads, head_dim, load_cpu_kernels())(0, q, new_k, new_v, batch)
    k[64 + 40], v[64 + 40] = new_k[0], new_v[0]
    k[20:30], v[20:30] = chunk_k, chunk_v
    want_decode = reference_decode(q[:1], k, v, [[4, 5, 6]], [41])
    want_chunk = reference_decode(q[1:], k, v, [[0, 1]] * 10, list(range(21, 31)))
    torch.testing.assert_close(out[:1], want_decode, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1:], want_chunk, atol=1e-5, rtol=1e-5)
