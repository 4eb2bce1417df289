"""One element, taken apart: what a person needs to see when two engines disagree on it.

Decimal text alone hides the differences that matter for parity (-0 vs +0, NaN payloads,
one ULP), so every element is shown with its raw bits and their fields as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sessions.bits.dtypes import FLOAT_BIT_DTYPES, as_values, logical_dtype
from sessions.bits.ulp import float_layout, is_float_dtype, ulp_distance


@dataclass(frozen=True)
class ElementInfo:
    """A stored element decoded for display; `bits` is the raw pattern as an int."""

    logical_dtype: str
    bits: int
    hex: str
    """Raw bits as 0x-prefixed hex, zero-padded to the storage width."""
    decimal: str
    """Shortest round-trip decimal text of the value ('-0.0', 'nan', '-inf' spelled out)."""
    sign: int
    exponent: int
    """Biased exponent field (floats); 0 for integers."""
    mantissa: int
    """Mantissa (fraction) field (floats); 0 for integers."""
    is_negative_zero: bool
    is_nan: bool
    is_inf: bool
    nan_payload: int
    """Mantissa bits of a NaN (quiet bit included); 0 when not a NaN."""


def _scalar_bits(bits_scalar: int | np.integer | np.ndarray, logical: str) -> np.ndarray:
    """The scalar as a 1-element array of the dtype's storage, reinterpreting not converting."""
    storage = FLOAT_BIT_DTYPES.get(logical, logical_dtype(logical).storage)
    if isinstance(bits_scalar, np.ndarray) or isinstance(bits_scalar, np.generic):
        raw = np.asarray(bits_scalar).reshape(1)
        if raw.dtype.itemsize != storage.itemsize:
            raise ValueError(f"{raw.dtype} bits cannot hold a {logical} element")
        return raw.view(storage)
    width = storage.itemsize * 8
    value = int(bits_scalar)
    if storage.kind == "i" or storage.kind == "b":
        return np.array([value], dtype=storage)
    if not 0 <= value < (1 << width):
        raise ValueError(f"{value:#x} does not fit in {width} bits")
    return np.array([value], dtype=storage)


def _decimal(value: np.generic) -> str:
    if isinstance(value, (np.bool_, bool)):
        return str(bool(value))
    if np.issubdtype(type(value), np.integer):
        return str(int(value))
    return repr(float(value)) if not np.isnan(float(value)) else "nan"


def describe(bits_scalar: int | np.integer | np.ndarray, logical_dtype_name: str) -> ElementInfo:
    """Decode one stored element (its raw bits, as read by `Capture.read_bits`).

    `bits_scalar` may be a Python int holding the pattern, or a numpy scalar/1-element array
    of the storage (or same-width) dtype.
    """
    ld = logical_dtype(logical_dtype_name)
    if ld.is_quantized:
        raise ValueError(f"{logical_dtype_name} is a quantized block format; elements are not stored singly")
    raw = _scalar_bits(bits_scalar, logical_dtype_name)
    width = raw.dtype.itemsize * 8
    unsigned = int(raw.view(np.dtype(f"u{raw.dtype.itemsize}"))[0])
    value = as_values(raw, logical_dtype_name)[0]
    hex_text = f"0x{unsigned:0{width // 4}x}"
    if not is_float_dtype(logical_dtype_name):
        negative = ld.storage.kind == "i" and unsigned >> (width - 1) == 1
        return ElementInfo(
            logical_dtype_name, unsigned, hex_text, _decimal(value), int(negative), 0, 0, False, False, False, 0
        )
    exp_bits, man_bits = float_layout(logical_dtype_name)
    sign = unsigned >> (width - 1)
    exponent = (unsigned >> man_bits) & ((1 << exp_bits) - 1)
    mantissa = unsigned & ((1 << man_bits) - 1)
    all_ones = exponent == (1 << exp_bits) - 1
    is_nan = all_ones and mantissa != 0
    return ElementInfo(
        logical_dtype=logical_dtype_name,
        bits=unsigned,
        hex=hex_text,
        decimal="nan" if is_nan else repr(float(value)),
        sign=sign,
        exponent=exponent,
        mantissa=mantissa,
        is_negative_zero=sign == 1 and exponent == 0 and mantissa == 0,
        is_nan=is_nan,
        is_inf=all_ones and mantissa == 0,
        nan_payload=mantissa if is_nan else 0,
    )


def ulp_between(a: int | np.integer | np.ndarray, b: int | np.integer | np.ndarray, logical_dtype_name: str) -> int | None:
    """ULP distance between two stored elements; None when either is a NaN (undefined).

    -0 and +0 are 1 ULP apart (see sessions.bits.ulp for the convention).
    """
    bits_a = _scalar_bits(a, logical_dtype_name)
    bits_b = _scalar_bits(b, logical_dtype_name)
    if is_float_dtype(logical_dtype_name) and (describe(a, logical_dtype_name).is_nan or describe(b, logical_dtype_name).is_nan):
        return None
    return int(ulp_distance(bits_a, bits_b, logical_dtype_name)[0])
