"""Single-precision operations numpy lacks: a fused multiply-add rounded once, and the C library's float math.

Reproducing another engine's bits means repeating its roundings exactly. numpy rounds every
float32 operation once, as a CPU does, but it has no fused multiply-add (the compiler's
contraction, AVX2's `_mm256_fmadd_ps`), and its `np.cos`/`np.exp` on float32 are its own SIMD
approximations, not the `cosf`/`expf` a C engine calls. Both are given here exactly:

- `fma` computes a*b + c with one rounding to float32. The product of two float32 values is
  exact in float64; the float64 sum is then rounded to odd (the inexact bit kept in the last
  place), and rounding that to float32 is correctly rounded, because float64 carries more
  than two bits beyond float32's 24 (Boldo and Melquiond, "Emulation of FMA and correctly
  rounded sums: proved algorithms using rounding to odd", IEEE TC 2008).
- `libm` calls the process's own C library (glibc on Linux), one element at a time: the
  functions ggml calls by name.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache

import numpy as np


def fma(a: np.ndarray | float, b: np.ndarray | float, c: np.ndarray | float) -> np.ndarray:
    """float32(a * b + c) rounded once, elementwise with broadcasting (inputs are float32 values)."""
    a64, b64, c64 = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    with np.errstate(invalid="ignore", over="ignore"):
        product = a64 * b64
        total = product + c64
        back = total - c64
        error = (product - back) + (c64 - (total - back))
    inexact_even = (error != 0) & np.isfinite(total) & ((total.view(np.int64) & 1) == 0)
    if inexact_even.any():
        toward = np.where(error > 0, np.inf, -np.inf)
        total = np.where(inexact_even, np.nextafter(total, toward), total)
    with np.errstate(over="ignore"):
        return total.astype(np.float32)


@cache
def _libm() -> ctypes.CDLL:
    name = ctypes.util.find_library("m")
    if name is None:
        raise OSError("no C math library found to call cosf/sinf/expf/powf from")
    return ctypes.CDLL(name)


@cache
def libm(name: str) -> Callable[..., float]:
    """The C library's single-precision function `name` (cosf, sinf, expf, powf), as ggml calls it."""
    function = getattr(_libm(), name)
    function.restype = ctypes.c_float
    function.argtypes = [ctypes.c_float] * (2 if name == "powf" else 1)
    return function  # type: ignore[no-any-return]


def libm_map(name: str, values: np.ndarray) -> np.ndarray:
    """`name` applied to every float32 element, through the C library."""
    function = libm(name)
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    out = np.fromiter((function(float(v)) for v in flat), dtype=np.float32, count=flat.size)
    return out.reshape(np.shape(values))


def hsum8(lanes: np.ndarray) -> np.ndarray:
    """The x86 horizontal sum of 8 float32 lanes (last axis) that tinyBLAS and ggml's hsum_float_8
    use: high half plus low half, then lanes (0+2) + (1+3)."""
    half = (lanes[..., 4:8] + lanes[..., 0:4]).astype(np.float32)
    return ((half[..., 0] + half[..., 2]) + (half[..., 1] + half[..., 3])).astype(np.float32)
