"""Where a packed record's bytes lie: how many there are, the shape they are read in, and the
byte runs of a selection.

A pack is a 1-D uint8 dataset holding many tensors' stored bytes back to back
(docs/capture-format.md, "Packs"); an index row places one tensor in it by `offset` and
`nbytes`. Per-tensor datasets made a large capture cost a libhdf5 object per record to write
and to check; a pack costs one per few MiB. Reading a record whole, or the canonical row range
a comparison reads in chunks, is reading a regular run of pack bytes: `count` runs of `length`
bytes, `stride` apart, which libhdf5 reads as one hyperslab straight into the caller's buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sessions.bits.dtypes import (
    LOGICAL_DTYPES,
    logical_dtype,
    quant_block_geometry,
    quantized_nbytes,
)
from sessions.capture import format as cf

Selection = tuple[slice | int, ...] | None

MAX_ELEMENTS = 2**58
"""Rows whose shape holds more elements take no byte count (counting bytes would overflow int64)."""


def stored_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of this logical dtype and shape takes in a pack; ValueError when none fits
    (an unknown dtype, or GGML blocks whose last dimension is not whole blocks)."""
    ld = logical_dtype(dtype)
    if ld.ggml_type is not None:
        return quantized_nbytes(ld.ggml_type, shape)
    return math.prod(shape) * ld.storage.itemsize


def stored_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a packed record's stored bits are read in: its logical shape, or for GGML
    blocks one row of block bytes per logical row, as `gguf.quants.quantize` returns them."""
    ld = logical_dtype(dtype)
    if ld.ggml_type is None:
        return shape
    block, size = quant_block_geometry(ld.ggml_type)
    return (*shape[:-1], shape[-1] // block * size)


def expected_nbytes(dtypes: np.ndarray, dtype_codes: np.ndarray, ndims: np.ndarray, dims: list[np.ndarray]) -> np.ndarray:
    """`stored_nbytes` of every index row at once, from its dtype (`codes` of the column), ndim
    and shape (one column per axis); -1 where none fits (also an unknown dtype, an ndim
    outside 0..8, a negative dimension, or a shape too large to count)."""
    usable = (ndims >= 0) & (ndims <= cf.MAX_NDIM)
    elements = np.ones(len(ndims), dtype=np.int64)
    approximate = np.ones(len(ndims), dtype=np.float64)
    last = np.zeros(len(ndims), dtype=np.int64)
    for axis, extent in enumerate(dims):
        used = axis < ndims
        usable &= ~used | (extent >= 0)
        taken = np.where(used, extent, 1)
        elements *= taken
        approximate *= taken
        last = np.where(ndims == axis + 1, extent, last)
    usable &= approximate <= MAX_ELEMENTS
    counted = np.full(len(ndims), -1, dtype=np.int64)
    for code, raw in enumerate(dtypes.tolist()):
        ld = LOGICAL_DTYPES.get(cf.decode_field(raw))
        rows = usable & (dtype_codes == code)
        if ld is None or not rows.any():
            continue
        if ld.ggml_type is None:
            counted[rows] = elements[rows] * ld.storage.itemsize
            continue
        block, size = quant_block_geometry(ld.ggml_type)
        whole = rows & (ndims > 0) & (last % block == 0)
        counted[whole] = elements[whole] // block * size
    return counted


@dataclass(frozen=True)
class ByteRuns:
    """The bytes of a selection of a C-order array: `count` runs of `length` bytes, `stride`
    apart, from `start` (relative to the array's first byte).

    They hold the elements of `box` in order; `within` selects the selection from that box,
    or is None when the runs hold exactly the selection (read straight into its buffer)."""

    start: int
    length: int
    stride: int
    count: int
    box: tuple[int, ...]
    within: tuple[slice | int, ...] | None

    @property
    def nbytes(self) -> int:
        return self.length * self.count


def _parts(shape: tuple[int, ...], selection: Selection) -> list[tuple[int, int, int] | int]:
    """Each axis's selection as (start, stop, step) with a positive step, or an index."""
    given = () if selection is None else selection if isinstance(selection, tuple) else (selection,)
    if len(given) > len(shape):
        raise ValueError(f"selection {selection} has more dimensions than shape {shape}")
    parts: list[tuple[int, int, int] | int] = []
    for axis, extent in enumerate(shape):
        part = given[axis] if axis < len(given) else slice(None)
        if isinstance(part, slice):
            start, stop, step = part.indices(extent)
            if step < 1:
                raise ValueError("selection steps must be positive")
            parts.append((start, max(start, stop), step))
            continue
        index = int(part) + extent if int(part) < 0 else int(part)
        if not 0 <= index < extent:
            raise IndexError(f"index {part} is out of range for an axis of {extent}")
        parts.append(index)
    return parts


def selection_shape(shape: tuple[int, ...], selection: Selection) -> tuple[int, ...]:
    """The shape of `selection` of an array of `shape` (indexed axes dropped)."""
    return tuple(len(range(*part)) for part in _parts(shape, selection) if not isinstance(part, int))


def byte_runs(shape: tuple[int, ...], itemsize: int, selection: Selection) -> ByteRuns:
    """The runs holding `selection` of a C-order array: the first axis the selection does not
    take whole decides them; every axis before it is whole, every axis after it read whole."""
    if selection is None:
        total = math.prod(shape) * itemsize
        return ByteRuns(0, total, total, 1, shape, None)
    parts = _parts(shape, selection)
    whole = [part == (0, extent, 1) for part, extent in zip(parts, shape)]
    if all(whole):
        total = math.prod(shape) * itemsize
        return ByteRuns(0, total, total, 1, shape, None)
    axis = whole.index(False)
    part = parts[axis]
    if isinstance(part, int):
        low, high, step = part, part + 1, 1
    else:
        start, stop, step = part
        count = len(range(start, stop, step))
        low, high = start, start + (count - 1) * step + 1 if count else start
    inner = math.prod(shape[axis + 1 :]) * itemsize
    box = (*shape[:axis], high - low, *shape[axis + 1 :])
    exact = step == 1 and all(whole[axis + 1 :])
    within = None
    if not exact:
        here: slice | int = 0 if isinstance(part, int) else slice(0, high - low, step)
        later = tuple(p if isinstance(p, int) else slice(*p) for p in parts[axis + 1 :])
        within = (*(slice(None),) * axis, here, *later)
    count = math.prod(shape[:axis])
    length = (high - low) * inner
    return ByteRuns(low * inner, length, shape[axis] * inner, count, box, within)


def overlapping(offsets: np.ndarray, nbytes: np.ndarray, ranged: np.ndarray, pack_codes: np.ndarray) -> np.ndarray:
    """For each row `ranged` marks, a row of the same pack (same `pack_codes`) whose bytes it shares, or -1.

    Sorted by (pack, offset), any two overlapping ranges imply an overlapping neighbour pair
    (the earlier of the two overlaps the range right after it), so checking neighbours finds
    every pack that has an overlap. A writer appends, so rows usually come in that order
    already and need no sort."""
    partner = np.full(len(offsets), -1, dtype=np.int64)
    rows = np.flatnonzero(ranged & (nbytes > 0))
    if len(rows) < 2:
        return partner
    packs, starts = pack_codes[rows], offsets[rows]
    if not np.all((packs[1:] > packs[:-1]) | ((packs[1:] == packs[:-1]) & (starts[1:] >= starts[:-1]))):
        order = np.lexsort((starts, packs))
        rows, packs, starts = rows[order], packs[order], starts[order]
    ends = starts + np.minimum(nbytes[rows], np.iinfo(np.int64).max - starts)
    hit = (packs[1:] == packs[:-1]) & (starts[1:] < ends[:-1])
    partner[rows[1:][hit]] = rows[:-1][hit]
    return partner
