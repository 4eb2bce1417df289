"""ggml's float32 dot products compiled with numba: the same roundings as `f32_ops`, at native speed.

A candidate reproduces an engine's bits only by repeating every rounding of its FMA chains. In
numpy each step of a chain is a pass over the whole array, about 50 ns per multiply-add: a
real model's prefill projection (1008 rows, 4096 x 4096) took a quarter of an hour per op. Here
each output's chain runs as scalar code, one multiply-add a few nanoseconds.

`fma32` is `f32_ops.fma` for one element: the product of two float32 values is exact in
float64, the sum's rounding error comes from TwoSum, and when the float64 sum sits exactly
halfway between two float32 values (a tie that rounding it again would break the wrong way)
the error says which side the exact sum is on. numba emits separate multiplies and adds,
which LLVM does not fuse without fast-math flags, so the float64 steps are what they say.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, prange

LANES = 8
FLOAT32_MAX = float(np.finfo(np.float32).max)
OVERFLOW_MIDPOINT = 2.0**128 - 2.0**103
"""Halfway between the largest float32 and 2^128: from here up, float32 rounding gives infinity."""

_LAUNCH = threading.Lock()
"""One parallel kernel at a time per process: numba's workqueue threading layer (macOS, or Linux
without libgomp) terminates the process when two threads launch parallel kernels at once, and
the viewer's workers may overlap."""


def parallel_kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` compiled with its outer `prange` over outputs spread across the cores (each
    output's chain stays whole, so the bits do not depend on the thread count), launched under
    `_LAUNCH`."""
    compiled = njit(cache=True, parallel=True)(function)

    @functools.wraps(function)
    def launch(*args: Any) -> Any:
        with _LAUNCH:
            return compiled(*args)

    return launch


@njit(inline="always", cache=True)
def fma32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    product = np.float64(a) * np.float64(b)
    addend = np.float64(c)
    total = product + addend
    back = total - addend
    error = (product - back) + (addend - (total - back))
    rounded = np.float32(total)
    if error != 0.0:
        near = np.float64(rounded)
        if np.isinf(near):
            # Only the overflow midpoint can round the wrong way here: just below it the exact
            # sum is the largest float32, not infinity.
            if abs(total) == OVERFLOW_MIDPOINT and (error > 0.0) != (total > 0.0):
                rounded = np.float32(FLOAT32_MAX if total > 0.0 else -FLOAT32_MAX)
        else:
            other = 2.0 * total - near
            if other != near and np.float64(np.float32(other)) == other and (error > 0.0) == (other > near):
                rounded = np.float32(other)
    return rounded


@njit(inline="always", cache=True)
def _multiply_add(a: np.float32, b: np.float32, c: np.float32, fused: bool) -> np.float32:
    return fma32(a, b, c) if fused else np.float32(np.float32(a * b) + c)


@njit(inline="always", cache=True)
def reduce8(lanes: np.ndarray, adjacent: bool) -> np.float32:
    """8 lanes summed as x86 does: each low lane plus its high one, then `adjacent` pairs
    (0+1) + (2+3) as GGML_F32x8_REDUCE's `_mm_hadd_ps`, else (0+2) + (1+3) as tinyBLAS's `hsum`."""
    h0 = np.float32(lanes[0] + lanes[4])
    h1 = np.float32(lanes[1] + lanes[5])
    h2 = np.float32(lanes[2] + lanes[6])
    h3 = np.float32(lanes[3] + lanes[7])
    if adjacent:
        return np.float32(np.float32(h0 + h1) + np.float32(h2 + h3))
    return np.float32(np.float32(h0 + h2) + np.float32(h1 + h3))


@parallel_kernel
def dot_tinyblas(weight: np.ndarray, x: np.ndarray, fused: bool) -> np.ndarray:
    """x @ weight.T, per output 8 lanes, lane i accumulating elements i, i+8, ...; then tinyBLAS's `hsum`."""
    rows, k = x.shape
    outputs = weight.shape[0]
    out = np.empty((rows, outputs), dtype=np.float32)
    for o in prange(outputs):
        lanes = np.empty(LANES, dtype=np.float32)
        for r in range(rows):
            lanes[:] = 0
            for start in range(0, k, LANES):
                for lane in range(LANES):
                    lanes[lane] = _multiply_add(weight[o, start + lane], x[r, start + lane], lanes[lane], fused)
            out[r, o] = reduce8(lanes, False)
    return out


@parallel_kernel
def dot_vec_f32(weight: np.ndarray, x: np.ndarray, fused: bool) -> np.ndarray:
    """x @ weight.T as ggml_vec_dot_f32: four 8-lane accumulators over steps of 32, reduced
    (0+2) + (1+3), then across lanes; leftover elements added one by one in float64."""
    rows, k = x.shape
    outputs = weight.shape[0]
    whole = k - k % 32
    out = np.empty((rows, outputs), dtype=np.float32)
    for o in prange(outputs):
        sums = np.empty((4, LANES), dtype=np.float32)
        reduced = np.empty(LANES, dtype=np.float32)
        for r in range(rows):
            sums[:, :] = 0
            for start in range(0, whole, 32):
                for j in range(4):
                    base = start + j * LANES
                    for lane in range(LANES):
                        sums[j, lane] = _multiply_add(x[r, base + lane], weight[o, base + lane], sums[j, lane], fused)
            for lane in range(LANES):
                reduced[lane] = np.float32(np.float32(sums[0, lane] + sums[2, lane]) + np.float32(sums[1, lane] + sums[3, lane]))
            total = np.float64(reduce8(reduced, True))
            for i in range(whole, k):
                total += np.float64(np.float32(x[r, i] * weight[o, i]))
            out[r, o] = np.float32(total)
    return out


@parallel_kernel
def dot_q8_0(weight_scale: np.ndarray, weight_values: np.ndarray, x_scale: np.ndarray, x_values: np.ndarray) -> np.ndarray:
    """The Q8_0 x Q8_0 dot of every activation row with every weight row: per block of 32, 8
    integer lanes of 4 products, converted to float, times the float product of the two scales,
    FMA-accumulated per lane; then tinyBLAS's `hsum`."""
    rows, blocks = x_scale.shape
    outputs = weight_scale.shape[0]
    out = np.empty((rows, outputs), dtype=np.float32)
    for o in prange(outputs):
        lanes = np.empty(LANES, dtype=np.float32)
        for r in range(rows):
            lanes[:] = 0
            for b in range(blocks):
                both = np.float32(weight_scale[o, b] * x_scale[r, b])
                for lane in range(LANES):
                    total = 0
                    for i in range(4):
                        total += weight_values[o, b, 4 * lane + i] * x_values[r, b, 4 * lane + i]
                    lanes[lane] = fma32(both, np.float32(total), lanes[lane])
            out[r, o] = reduce8(lanes, False)
    return out


@parallel_kernel
def fma_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b.T with each output one FMA chain from 0 along the shared axis (`simd_gemm`'s order
    for every output: its lanes are outputs, never a split of one output's sum)."""
    rows, k = a.shape
    outputs = b.shape[0]
    out = np.empty((rows, outputs), dtype=np.float32)
    for o in prange(outputs):
        for r in range(rows):
            acc = np.float32(0)
            for i in range(k):
                acc = fma32(a[r, i], b[o, i], acc)
            out[r, o] = acc
    return out


@parallel_kernel
def fma_accumulate(acc: np.ndarray, weights: np.ndarray, values: np.ndarray) -> None:
    """acc[r, d] gains weights[r, c] * values[c, d] for c in order, one FMA each (in place)."""
    rows, cells = weights.shape
    dims = values.shape[1]
    for r in prange(rows):
        for c in range(cells):
            w = weights[r, c]
            for d in range(dims):
                acc[r, d] = fma32(w, values[c, d], acc[r, d])
