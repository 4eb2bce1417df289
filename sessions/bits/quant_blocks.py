"""The GGML block an element of a quantized tensor lives in, as stored on both sides.

A quantized capture has no per-element bits: each block of 32 (or 256) elements is stored as
scales and packed quants, and the diff engine compares those bytes. Showing an element of
such a tensor means showing its decoded value and the raw block it was decoded from, with the
bytes that differ named -- a changed scale moves every element of the block, a changed quant
only its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sessions.bits.dtypes import logical_dtype, quant_block_geometry


@dataclass(frozen=True)
class QuantBlock:
    dtype: str
    """The capture's logical dtype name (q8_0, q4_K, ...)."""
    index: int
    first_element: int
    elements: int
    native_hex: str
    oracle_hex: str
    differing_bytes: tuple[int, ...]
    """Byte offsets within the block where the two sides differ."""


def block_of(native_raw: np.ndarray, oracle_raw: np.ndarray, logical: str, flat_index: int) -> QuantBlock:
    """The block holding element `flat_index` (row-major over the logical shape; GGML blocks run
    along the innermost axis, so consecutive elements share a block)."""
    ggml_type = logical_dtype(logical).ggml_type
    if ggml_type is None:
        raise ValueError(f"{logical} is not a quantized dtype")
    elements, size = quant_block_geometry(ggml_type)
    index = flat_index // elements
    native = np.asarray(native_raw, dtype=np.uint8).reshape(-1)[index * size : (index + 1) * size]
    oracle = np.asarray(oracle_raw, dtype=np.uint8).reshape(-1)[index * size : (index + 1) * size]
    if native.size != size or oracle.size != size:
        raise ValueError(f"element {flat_index} is past the stored {ggml_type} blocks")
    differing = tuple(int(i) for i in np.flatnonzero(native != oracle))
    return QuantBlock(logical, index, index * elements, elements, native.tobytes().hex(), oracle.tobytes().hex(), differing)
