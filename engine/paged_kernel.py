"""The CPU paged-KV kernels (csrc/paged_attention.cpp): built once, called through ctypes.

Algorithm: the C++ source is compiled with the host compiler (`-O3 -march=native -fopenmp`) into a
shared library cached under `<cache>/kernels/<hash>/`, the hash covering the source, the flags
and the CPU, and written atomically (temporary file + rename). The library shares torch's OpenMP
runtime (same soname, loaded after torch), so it uses torch's thread count without oversubscribing.
Invariant: `load_kernel()` returns working kernels or None (no compiler, unsupported platform),
never a half-built library; callers fall back to the torch implementation on None.
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

SOURCE = Path(__file__).with_name("csrc") / "paged_attention.cpp"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
BLOCK_SIZE = 16  # the kernel's vector width in tokens: the KV block size it requires
HEAD_DIMS = (64, 128)
MAX_GROUP = 8  # query heads per KV head the kernel is instantiated for

log = logging.getLogger(__name__)

_Ptr, _I64 = ctypes.c_void_p, ctypes.c_int64
_DECODE_ARGS: list[type[ctypes._SimpleCData[Any]]] = [
    *[_Ptr] * 5,  # q, k_cache, v_cache, block_tables, context_lens
    *[_I64] * 5,  # rows, heads, kv_heads, head_dim, max_blocks
    ctypes.c_float,  # scale
    _Ptr,  # out
    ctypes.c_int,  # num_threads
]
_WRITE_ARGS: list[type[ctypes._SimpleCData[Any]]] = [
    _Ptr,  # k
    _I64,  # its row stride
    _Ptr,  # v
    _I64,  # its row stride
    *[_Ptr] * 2,  # blocks, offsets (int64)
    *[_I64] * 3,  # tokens, kv_heads, head_dim
    *[_Ptr] * 2,  # k_cache, v_cache
]
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


class PagedKernels:
    """ctypes front of `fg_paged_{write,decode}_{f32,bf16}`, taking CPU tensors."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._decode = {dt: getattr(lib, f"fg_paged_decode_{s}") for dt, s in _SUFFIX.items()}
        self._write = {dt: getattr(lib, f"fg_paged_write_{s}") for dt, s in _SUFFIX.items()}
        for fn in self._decode.values():
            fn.argtypes, fn.restype = _DECODE_ARGS, ctypes.c_int
        for fn in self._write.values():
            fn.argtypes, fn.restype = _WRITE_ARGS, None

    def supports(
        self, dtype: torch.dtype, block_size: int, head_dim: int, heads: int, kv_heads: int
    ) -> bool:
        grouped = heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP
        return grouped and dtype in _SUFFIX and block_size == BLOCK_SIZE and head_dim in HEAD_DIMS

    def write(
        self,
        k: torch.Tensor,  # [T, KH, D], each row's heads contiguous
        v: torch.Tensor,  # [T, KH, D], each row's heads contiguous
        blocks: torch.Tensor,  # [T] int64
        offsets: torch.Tensor,  # [T] int64
        k_cache: torch.Tensor,  # [NB, KH, D, BS]
        v_cache: torch.Tensor,  # [NB, KH, BS, D]
    ) -> None:
        tokens, kv_heads, head_dim = k.shape
        for t in (k, v):
            assert t.stride(2) == 1 and t.stride(1) == head_dim, "heads must be contiguous"
        assert blocks.dtype == offsets.dtype == torch.int64
        self._write[k.dtype](
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            blocks.data_ptr(),
            offsets.data_ptr(),
            tokens,
            kv_heads,
            head_dim,
            k_cache.data_ptr(),
            v_cache.data_ptr(),
        )

    def decode(
        self,
        q: torch.Tensor,  # [R, H, D]
        k_cache: torch.Tensor,  # [NB, KH, D, BS]
        v_cache: torch.Tensor,  # [NB, KH, BS, D]
        block_tables: torch.Tensor,  # [R, max_blocks] int32
        context_lens: torch.Tensor,  # [R] int32
        scale: float,
        out: torch.Tensor,  # [R, H, D]
    ) -> None:
        rows, heads, head_dim = q.shape
        status = self._decode[q.dtype](
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            block_tables.data_ptr(),
            context_lens.data_ptr(),
            rows,
            heads,
            k_cache.shape[1],
            head_dim,
            block_tables.shape[1],
            scale,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        assert status == 0, f"paged kernel rejected head_dim {head_dim}, heads {heads}"


@functools.cache
def load_kernel() -> PagedKernels | None:
    """The compiled kernels, building them on first use; None where they cannot be built."""
    if platform.system() != "Linux" or shutil.which("g++") is None:
        return None
    try:
        return PagedKernels(ctypes.CDLL(str(_build())))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("paged attention kernel unavailable, using the torch path: %s", exc)
        return None


def _build() -> Path:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + _cpu_id().encode()).hexdigest()[:16]
    folder = cache_root() / "kernels" / key
    lib = folder / "libfg_paged_attention.so"
    if lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        subprocess.run(
            ["g++", *FLAGS, str(SOURCE), "-o", tmp], check=True, capture_output=True, timeout=300
        )
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
