"""The CPU kernels against their torch references: KV writes, argmax and the fused row ops."""

from __future__ import annotations

import pytest
import torch

from engine.cpu_kernels import CpuKernels, load_cpu_kernels
from engine.kv_cache import KVCache
from engine.row_ops import TorchRowOps

BLOCK = 16


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    built = load_cpu_kernels()
    assert built is not None  # g++ is part of the environment: the fast path must be tested
    return built


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_write_matches_the_torch_write_from_strided_rows(
    kernels: CpuKernels, dtype: torch.dtype
) -> None:
    kv_heads, head_dim, tokens = 3, 64, 40
    fused = torch.randn(tokens, 2 * kv_heads + 1, head_dim).to(dtype)  # like slices of a qkv row
    k, v = fused[:, 1 : 1 + kv_heads], fused[:, 1 + kv_heads :]
    blocks = torch.randperm(8)[torch.arange(tokens) // BLOCK]
    offsets = (torch.arange(tokens) + 5) % BLOCK
    by_torch = KVCache(1, 8, BLOCK, kv_heads, head_dim, dtype, torch.device("cpu"))
    by_kernel = KVCache(1, 8, BLOCK, kv_heads, head_dim, dtype, torch.device("cpu"))
    by_torch.write(0, k, v, blocks, offsets)
    kernels.write(k, v, blocks, offsets, by_kernel.keys[0], by_kernel.values[0])
    assert torch.equal(by_kernel.keys[0], by_torch.keys[0])
    assert torch.equal(by_kernel.values[0], by_torch.values[0])
    assert by_torch.keys[0].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [1, 7, 16, 49, 1000])
def test_argmax_matches_torch_including_ties_and_short_rows(
    kernels: CpuKernels, dtype: torch.dtype, cols: int
) -> None:
    g = torch.Generator().manual_seed(cols)
    x = torch.randint(-3, 4, (9, cols), generator=g).to(dtype)  # small ints: many ties
    x[0] = float("-inf")
    assert torch.equal(kernels.argmax(x), x.argmax(-1))


def test_argmax_of_real_sized_logits(kernels: CpuKernels) -> None:
    x = torch.randn(27, 49152, generator=torch.Generator().manual_seed(0))
    x[3, 40000] = x[3, 70] = 100.0  # a tie across vector lanes: the first index wins
    assert torch.equal(kernels.argmax(x), x.argmax(-1))
    assert torch.equal(kernels.argmax(x.bfloat16()), x.bfloat16().argmax(-1))


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32: summation order apart; bf16: one rounding step apart at most."""
    tol = 1e-5 if got.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_matches_torch(
    kernels: CpuKernels, dtype: torch.dtype, with_delta: bool
) -> None:
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(7, 200, generator=g) * 3).to(dtype)
    delta = torch.randn(7, 200, generator=g).to(dtype) if with_delta else None
    weight = torch.rand(200, generator=g).to(dtype)
    x_ref = x.clone()
    want = TorchRowOps().add_rms_norm(x_ref, delta, weight, 1e-5)
    got = kernels.add_rms_norm(x, delta, weight, 1e-5)
    assert torch.equal(x, x_ref)  # the residual update rounds exactly as torch's add
    assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_torch(kernels: CpuKernels, dtype: torch.dtype) -> None:
    gate_up = (torch.randn(5, 2 * 150, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    want = TorchRowOps().silu_mul(gate_up)
    assert_close(kernels.silu_mul(gate_up), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_rotates_the_leading_heads_in_place_like_torch(
    kernels: CpuKernels, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(3)
    heads, head_dim, width = 5, 64, 7 * 64  # the last two heads (values) stay as they are
    x = torch.randn(6, width, generator=g).to(dtype)
    cos = torch.rand(50, head_dim, generator=g).to(dtype)
    sin = torch.rand(50, head_dim, generator=g).to(dtype)
    positions = torch.tensor([0, 3, 49, 7, 7, 1])
    want = x.clone()
    TorchRowOps().rope(want, heads, head_dim, cos, sin, positions)
    kernels.rope(x, heads, head_dim, cos, sin, positions)
    assert_close(x, want)
    assert torch.equal(x[:, heads * head_dim :], want[:, heads * head_dim :])
