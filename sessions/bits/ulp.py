"""ULP distance on stored bits, for every float width the captures hold (bfloat16 included).

numpy's spacing helpers reject bfloat16 and work on values, where -0 == +0 and NaN != NaN.
Parity is about bits, so distances here come from the bit patterns: each float pattern is
mapped onto a signed integer line that is monotonic in value, and the distance is the
difference of the two positions.

Convention (docs/report-json.md): positive patterns keep their magnitude bits; a negative
pattern with magnitude m lands on -m - 1. Every distinct non-NaN pattern therefore has its
own place, so -0 and +0 are exactly 1 ULP apart -- a signed-zero difference is never a
distance of zero. NaN patterns have no place on the line: their distance is undefined and
they are counted as NaN mismatches instead.

Integer dtypes count one unit as one ULP.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from sessions.bits.dtypes import FLOAT_BIT_DTYPES, logical_dtype

_SIGNED_OF_UNSIGNED = {2: np.int16, 4: np.int32, 8: np.int64}


def is_float_dtype(logical: str) -> bool:
    """Whether ULP distance is defined by the float line (True) or by integer units (False)."""
    return logical in FLOAT_BIT_DTYPES


def float_layout(logical: str) -> tuple[int, int]:
    """(exponent bits, mantissa bits) of a float logical dtype."""
    return {"bfloat16": (8, 7), "float16": (5, 10), "float32": (8, 23), "float64": (11, 52)}[logical]


def _ulp_size_of_patterns(bits: np.ndarray, logical: str) -> np.ndarray:
    exponent_bits, mantissa_bits = float_layout(logical)
    unsigned = bits.view(FLOAT_BIT_DTYPES[logical]).astype(np.int64)
    biased = (unsigned >> mantissa_bits) & ((1 << exponent_bits) - 1)
    bias = (1 << (exponent_bits - 1)) - 1
    return np.ldexp(1.0, (np.maximum(biased, 1) - bias - mantissa_bits).astype(np.int32))


@cache
def _ulp_size_table(logical: str) -> np.ndarray:
    """Every 16-bit pattern's ULP size: one gather per element in place of six passes."""
    return _ulp_size_of_patterns(np.arange(1 << 16, dtype=np.uint16), logical)


def ulp_size(bits: np.ndarray, logical: str) -> np.ndarray:
    """The spacing of the float grid at each value (float64): one unit in the last place of that
    value's binade, the smallest subnormal spacing for zeros and subnormals. Integers: 1.

    It is the unit of the standard ULP error |native - oracle| / ulp(oracle), which stays small
    where two values straddle zero, unlike the count of representable steps between them."""
    if not is_float_dtype(logical):
        return np.ones(bits.shape, dtype=np.float64)
    if FLOAT_BIT_DTYPES[logical].itemsize == 2:
        return _ulp_size_table(logical)[bits.view(np.uint16)]
    return _ulp_size_of_patterns(bits, logical)


def _signed_line(bits: np.ndarray, logical: str) -> np.ndarray:
    """`ordered_line` in the patterns' own width: a negative pattern's magnitude bits are
    flipped (xor with the arithmetic sign shift), which lands magnitude m on -m - 1."""
    unsigned = bits.view(FLOAT_BIT_DTYPES[logical])
    signed = unsigned.view(_SIGNED_OF_UNSIGNED[unsigned.dtype.itemsize])
    width = unsigned.dtype.itemsize * 8
    magnitude_mask = np.array((1 << (width - 1)) - 1, dtype=signed.dtype)
    return signed ^ ((signed >> (width - 1)) & magnitude_mask)


def ordered_line(bits: np.ndarray, logical: str) -> np.ndarray:
    """Positions of float bit patterns on the monotonic signed line, as int64.

    Accepts the stored bits (any unsigned or same-width view). NaN patterns get positions
    past the infinities; callers mask them out with `nan_mask`.
    """
    return _signed_line(bits, logical).astype(np.int64)


def _magnitude_and_infinity(bits: np.ndarray, logical: str) -> tuple[np.ndarray, np.ndarray]:
    """The patterns without their sign bit, and the Inf pattern's magnitude in the same type:
    NaNs lie above it, the infinities on it."""
    unsigned = bits.view(FLOAT_BIT_DTYPES[logical])
    exp_bits, man_bits = float_layout(logical)
    width = unsigned.dtype.itemsize * 8
    magnitude = unsigned & np.array((1 << (width - 1)) - 1, dtype=unsigned.dtype)
    return magnitude, np.array(((1 << exp_bits) - 1) << man_bits, dtype=unsigned.dtype)


def nan_mask(bits: np.ndarray, logical: str) -> np.ndarray:
    """True where the pattern is a NaN (all exponent bits set, mantissa non-zero)."""
    magnitude, infinity = _magnitude_and_infinity(bits, logical)
    return magnitude > infinity


def inf_mask(bits: np.ndarray, logical: str) -> np.ndarray:
    """True where the pattern is +Inf or -Inf."""
    magnitude, infinity = _magnitude_and_infinity(bits, logical)
    return magnitude == infinity


def any_special(bits: np.ndarray, logical: str) -> bool:
    """Whether any pattern is a NaN or an Inf: one pass, so the common all-finite case skips
    the masks that classify them."""
    magnitude, infinity = _magnitude_and_infinity(bits, logical)
    return bool(magnitude.size) and bool(magnitude.max() >= infinity)


def _abs_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| of two int64 arrays as exact uint64 (the true difference can exceed int64)."""
    ua = a.view(np.uint64) if a.dtype == np.int64 else a.astype(np.int64).view(np.uint64)
    ub = b.view(np.uint64) if b.dtype == np.int64 else b.astype(np.int64).view(np.uint64)
    return np.where(a >= b, ua - ub, ub - ua)


def ulp_distance(native_bits: np.ndarray, oracle_bits: np.ndarray, logical: str) -> np.ndarray:
    """Element-wise ULP distance as uint64 (exact, f64 included).

    For floats, positions where either side is NaN hold 0 here; combine with `nan_mask`
    (the distance there is undefined). Quantized blocks have no ULP notion and are rejected.
    """
    if is_float_dtype(logical):
        a = _signed_line(np.ascontiguousarray(native_bits), logical)
        b = _signed_line(np.ascontiguousarray(oracle_bits), logical)
        if a.dtype.itemsize < 8:  # the difference of two 32-bit positions fits int64
            distance = np.abs(a.astype(np.int64) - b).view(np.uint64)
        else:
            distance = _abs_difference(a, b)
        either_nan = nan_mask(native_bits, logical) | nan_mask(oracle_bits, logical)
        distance[either_nan] = 0
        return distance
    ld = logical_dtype(logical)
    if ld.is_quantized:
        raise ValueError(f"{logical} is a quantized block format; ULP distance is not defined")
    if logical == "bool":
        return (native_bits != oracle_bits).astype(np.uint64)
    if ld.storage.kind == "u":
        a64 = native_bits.astype(np.uint64)
        b64 = oracle_bits.astype(np.uint64)
        return np.where(a64 >= b64, a64 - b64, b64 - a64)
    return _abs_difference(native_bits.astype(np.int64), oracle_bits.astype(np.int64))
