"""The runner's CPU kernels (csrc/*.cpp): paged KV write, paged decode attention, argmax, and the
fused row operations of a layer (residual add + RMSNorm, SiLU * up, RoPE), called through ctypes.

Algorithm: the C++ sources are compiled with the host compiler (`-O3 -march=native -fopenmp`) into
one shared library cached under `<cache>/kernels/<hash>/`, the hash covering the sources, the
flags and the CPU, and written atomically (temporary file + rename). The library shares torch's
OpenMP runtime (same soname, loaded after torch), so it uses torch's thread count without
oversubscribing. One ctypes call replaces the 4-10 small torch ops of each fused operation.
Invariant: `load_cpu_kernels()` returns working kernels or None (no compiler, unsupported
platform), never a half-built library; callers fall back to torch ops on None.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from engine.loader import cache_root

CSRC = Path(__file__).with_name("csrc")
SOURCES = (CSRC / "paged_attention.cpp", CSRC / "elementwise.cpp")
HEADERS = (CSRC / "common.h",)
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
BLOCK_SIZE = 16  # the attention kernel's vector width in tokens: the KV block size it requires
HEAD_DIMS = (64, 128)
MAX_GROUP = 8  # query heads per KV head the attention kernel is instantiated for
MAX_ROPE_HEAD_DIM = 512

log = logging.getLogger(__name__)

_P, _I, _F, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_SIGNATURES: dict[str, tuple[list[type[ctypes._SimpleCData[Any]]], Any]] = {
    # k, k row stride, v, v row stride, blocks, offsets, tokens, kv_heads, head_dim, caches
    "fg_paged_write": ([_P, _I, _P, _I, _P, _P, _I, _I, _I, _P, _P], None),
    # q, q row stride, caches, tables, lens, rows, heads, kv_heads, head_dim, max_blocks, scale,
    # out, threads
    "fg_paged_decode": ([_P, _I, _P, _P, _P, _P, _I, _I, _I, _I, _I, _F, _P, _N], ctypes.c_int),
    "fg_argmax": ([_P, _I, _I, _P, _N], None),  # x, rows, cols, out, threads
    # x, delta (or null), weight, eps, out, rows, cols, threads
    "fg_add_rms_norm": ([_P, _P, _P, _F, _P, _I, _I, _N], None),
    "fg_silu_mul": ([_P, _P, _I, _I, _N], None),  # gate_up, out, rows, intermediate, threads
    # x, rows, row stride, heads, head_dim, cos, sin_folded, positions, threads
    "fg_rope": ([_P, _I, _I, _I, _I, _P, _P, _P, _N], None),
}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _rows_of_heads(t: torch.Tensor) -> bool:
    """[rows, heads, head_dim] whose heads are contiguous inside each row."""
    return t.stride(2) == 1 and t.stride(1) == t.shape[2]


class CpuKernels:
    """ctypes front of the library; every tensor is a CPU tensor of a dtype in `_SUFFIX`."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns: dict[tuple[str, torch.dtype], Any] = {}
        for name, (argtypes, restype) in _SIGNATURES.items():
            for dtype, suffix in _SUFFIX.items():
                fn = getattr(lib, f"{name}_{suffix}")
                fn.argtypes, fn.restype = argtypes, restype
                self._fns[name, dtype] = fn

    def supports(
        self, dtype: torch.dtype, block_size: int, head_dim: int, heads: int, kv_heads: int
    ) -> bool:
        grouped = heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP
        return grouped and dtype in _SUFFIX and block_size == BLOCK_SIZE and head_dim in HEAD_DIMS

    def write(
        self,
        k: torch.Tensor,  # [T, KH, D]
        v: torch.Tensor,  # [T, KH, D]
        blocks: torch.Tensor,  # [T] int64
        offsets: torch.Tensor,  # [T] int64
        k_cache: torch.Tensor,  # [NB, KH, D, BS]
        v_cache: torch.Tensor,  # [NB, KH, BS, D]
    ) -> None:
        assert _rows_of_heads(k) and _rows_of_heads(v)
        assert blocks.dtype == offsets.dtype == torch.int64
        tokens, kv_heads, head_dim = k.shape
        self._fns["fg_paged_write", k.dtype](
            k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), blocks.data_ptr(),
            offsets.data_ptr(), tokens, kv_heads, head_dim, k_cache.data_ptr(), v_cache.data_ptr(),
        )  # fmt: skip

    def decode(
        self,
        q: torch.Tensor,  # [R, H, D]
        k_cache: torch.Tensor,  # [NB, KH, D, BS]
        v_cache: torch.Tensor,  # [NB, KH, BS, D]
        block_tables: torch.Tensor,  # [R, max_blocks] int32
        context_lens: torch.Tensor,  # [R] int32
        scale: float,
        out: torch.Tensor,  # [R, H, D] contiguous
    ) -> None:
        assert _rows_of_heads(q) and out.is_contiguous()
        rows, heads, head_dim = q.shape
        status = self._fns["fg_paged_decode", q.dtype](
            q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
            block_tables.data_ptr(), context_lens.data_ptr(), rows, heads, k_cache.shape[1],
            head_dim, block_tables.shape[1], scale, out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        assert status == 0, f"paged kernel rejected head_dim {head_dim}, heads {heads}"

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """torch.argmax(x, -1) of an [N, V] tensor (N, V >= 1)."""
        if x.dtype not in _SUFFIX or not x.is_contiguous():
            return x.argmax(-1)
        out = torch.empty(x.shape[0], dtype=torch.int64)
        self._fns["fg_argmax", x.dtype](
            x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr(), torch.get_num_threads()
        )
        return out

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """x += delta (in place, when given); returns RMSNorm(x) * weight. x: [T, hidden]."""
        assert x.is_contiguous() and (delta is None or delta.is_contiguous())
        out = torch.empty_like(x)
        self._fns["fg_add_rms_norm", x.dtype](
            x.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(), eps,
            out.data_ptr(), x.shape[0], x.shape[1], torch.get_num_threads(),
        )  # fmt: skip
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for rows [gate | up]: [T, 2I] -> [T, I]."""
        assert gate_up.is_contiguous()
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = gate_up.new_empty(rows, inter)
        self._fns["fg_silu_mul", gate_up.dtype](
            gate_up.data_ptr(), out.data_ptr(), rows, inter, torch.get_num_threads()
        )
        return out

    def rope(
        self,
        x: torch.Tensor,  # [T, width]: rows whose first `heads` heads are rotated in place
        heads: int,
        head_dim: int,
        cos: torch.Tensor,  # [P, D]
        sin_folded: torch.Tensor,  # [P, D]
        positions: torch.Tensor,  # [T] int64
    ) -> None:
        assert x.stride(1) == 1 and cos.is_contiguous() and sin_folded.is_contiguous()
        assert head_dim <= MAX_ROPE_HEAD_DIM and positions.dtype == torch.int64
        self._fns["fg_rope", x.dtype](
            x.data_ptr(), x.shape[0], x.stride(0), heads, head_dim, cos.data_ptr(),
            sin_folded.data_ptr(), positions.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip


@functools.cache
def load_cpu_kernels() -> CpuKernels | None:
    """The compiled kernels, building them on first use; None where they cannot be built."""
    if platform.system() != "Linux" or shutil.which("g++") is None:
        return None
    try:
        return CpuKernels(ctypes.CDLL(str(_build())))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning("CPU kernels unavailable, using torch ops: %s %s", exc, detail.decode()[-2000:])
        return None


def _build() -> Path:
    digest = hashlib.sha256()
    for part in (*SOURCES, *HEADERS):
        digest.update(part.read_bytes())
    digest.update(" ".join(FLAGS).encode() + _cpu_id().encode())
    folder = cache_root() / "kernels" / digest.hexdigest()[:16]
    lib = folder / "libfg_cpu_kernels.so"
    if lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        command = ["g++", *FLAGS, *map(str, SOURCES), "-o", tmp]
        subprocess.run(command, check=True, capture_output=True, timeout=300)
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def _cpu_id() -> str:
    """The CPU model and flags, so a cache shared across machines never serves a foreign build."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "|".join(sorted({line for line in lines if line.startswith(wanted)}))
