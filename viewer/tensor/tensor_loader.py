"""Background preparation of one aligned pair for the tensor view (no Qt here).

Reads both tensors in bounded chunks (h5py holds the interpreter lock while it reads, so
one huge read would freeze the window), brings them to the canonical layout with the
alignment's transform, cuts the chosen 2-D slice, asks sessions.compare.tensor_diff for the
element maps chunk by chunk, and reduces everything to screen resolution. The full
resolution bits of the slice are kept so the inspector reads exact elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyqtgraph as pg

from sessions.bits.dtypes import as_bit_pattern, as_values, logical_dtype
from sessions.capture.reader import Capture, Record
from sessions.compare.mapped_record import MappedRecord
from sessions.compare.pair_tensors import iter_read_canonical
from sessions.compare.tensor_diff import (
    TensorMetrics,
    element_maps,
    replaces_worst,
    worst_index,
)
from sessions.progress import Progress, ProgressGenerator
from viewer.tensor.display_aggregate import (
    block_factors,
    block_max,
    block_mean,
    finite_for_display,
    levels_of,
    to_rgba,
)

CHUNK_BYTES = 2 * 1024 * 1024
"""Bytes per read and per diff chunk: small enough that the UI thread gets the lock often."""

VALUE_LUT = pg.colormap.get("viridis").getLookupTable(nPts=256, alpha=True)
DIFF_LUT = pg.colormap.get("inferno").getLookupTable(nPts=256, alpha=True)

ABS_EDGES = np.concatenate(([0.0], np.logspace(-12, 4, 33)))


@dataclass(frozen=True)
class SliceSpec:
    """Which 2-D (or 1-D) cut of an N-D canonical tensor is shown."""

    row_axis: int | None
    col_axis: int
    index: tuple[int, ...]
    """A position for every axis; the entries of the shown axes are ignored."""

    @staticmethod
    def default(shape: tuple[int, ...], at: tuple[int, ...] | None = None) -> "SliceSpec":
        """The last two axes shown; the others held at `at` (the pair's worst element), else at 0:
        held at 0, a 3-D pair differing only at [2, 1, 3] opened on a slice that read bit-exact."""
        index = at if at is not None and len(at) == len(shape) and all(0 <= i < n for i, n in zip(at, shape)) else (0,) * len(shape)
        if len(shape) <= 1:
            return SliceSpec(None, 0, index)
        return SliceSpec(len(shape) - 2, len(shape) - 1, index)

    def cut(self, array: np.ndarray) -> np.ndarray:
        if array.ndim == 0:
            return array.reshape(1)
        selection: list[int | slice] = [slice(None) if axis in (self.row_axis, self.col_axis) else self.index[axis] for axis in range(array.ndim)]
        part = array[tuple(selection)]
        if self.row_axis is not None and self.row_axis > self.col_axis:
            part = part.T
        return part

    def coordinate(self, row: int | None, col: int) -> tuple[int, ...]:
        """The full N-D coordinate of a shown element; () for a scalar, as `report` prints it ([])."""
        if not self.index:
            return ()
        coord = list(self.index)
        if self.row_axis is not None and row is not None:
            coord[self.row_axis] = row
        coord[self.col_axis] = col
        return tuple(coord)


@dataclass(frozen=True)
class TensorRequest:
    label: str
    dtype: str
    native: Capture
    oracle: Capture
    native_side: MappedRecord
    oracle_side: MappedRecord
    """Each side's record as the comparison read it (its batch row, positions and layout)."""
    spec: SliceSpec | None = None
    metrics: TensorMetrics | None = None
    """The diff engine's metrics of the whole pair (histogram, per-row and per-head profiles)."""


@dataclass
class TensorSlice:
    request: TensorRequest
    shape: tuple[int, ...]
    spec: SliceSpec
    native_bits: np.ndarray
    oracle_bits: np.ndarray
    factors: tuple[int, int]
    images: dict[str, np.ndarray]
    """'native', 'oracle' values; 'absolute', 'relative' error and 'ULP' as log2(1 + ULP), at display size."""
    abs_hist: np.ndarray
    """Counts of |native - oracle| of the shown slice's differing finite elements in ABS_EDGES bins."""
    worst: tuple[int, ...] | None
    """Shown-slice position (row, col) or (col,) of the largest ULP distance; None when bit-exact."""
    levels: dict[str, tuple[float, float]]
    """Colour-scale range per image: 'values' (native and oracle share it) and each difference scale."""
    rgba: dict[str, np.ndarray]
    """2-D slices only: every image already coloured, so the UI thread only copies pixels."""
    differing: int
    total: int
    dtype: str
    """How native_bits/oracle_bits read: the pair's dtype, or float32 for decoded quantized blocks."""
    raw_blocks: tuple[np.ndarray, np.ndarray] | None = None
    """Quantized pairs: both sides' stored GGML blocks, for the inspector (sessions.bits.quant_blocks)."""
    notes: list[str] = field(default_factory=list)
    """Said beside the title: how what is shown relates to what was compared."""

    @property
    def is_1d(self) -> bool:
        return self.native_bits.ndim == 1


def _as_2d(array: np.ndarray) -> np.ndarray:
    return array.reshape(1, -1) if array.ndim == 1 else array


@dataclass
class _Maps:
    """Display images of a 2-D cut, and what was found while making them."""

    images: dict[str, np.ndarray]
    abs_hist: np.ndarray
    differing: int
    worst: tuple[float, int, int]
    """(ULP, row, col) of the largest ULP distance; ULP -1 when bit-exact."""


def _iter_maps(n2: np.ndarray, o2: np.ndarray, dtype: str, factors: tuple[int, int], label: str) -> ProgressGenerator[_Maps]:
    """Values (block mean) and the three difference scales (block max) of two 2-D bit arrays,
    chunk by chunk; yields Progress(rows done, rows)."""
    rows_per_chunk = max(factors[0], (CHUNK_BYTES // max(1, n2.shape[1] * n2.itemsize)) // factors[0] * factors[0])
    images: dict[str, list[np.ndarray]] = {k: [] for k in ("native", "oracle", "absolute", "relative", "ULP")}
    abs_hist = np.zeros(len(ABS_EDGES) - 1, dtype=np.int64)
    differing = 0
    worst: tuple[float, int, int] = (-1.0, 0, 0)
    worst_moved = False
    for start in range(0, n2.shape[0], rows_per_chunk):
        stop = min(n2.shape[0], start + rows_per_chunk)
        nb, ob = n2[start:stop], o2[start:stop]
        abs_err, rel_err, ulp = element_maps(nb, ob, dtype)
        with np.errstate(all="ignore"):
            values_n = as_values(nb, dtype).astype(np.float32)
            values_o = as_values(ob, dtype).astype(np.float32)
        # The worst element is the report's: the farthest that has a ULP distance (a NaN on either
        # side has none), so both name one element; the map draws a NaN as the worst kind of difference.
        ranked = np.where(np.isnan(ulp), -1.0, ulp)
        ulp = np.where(np.isnan(ulp), np.inf, ulp)
        # Bits, not values: a +0/-0 swap differs and an identical NaN does not, as the report counts.
        differing += int(np.count_nonzero(as_bit_pattern(nb, dtype) != as_bit_pattern(ob, dtype)))
        differs = abs_err[np.isfinite(abs_err) & (abs_err > 0)]
        abs_hist += np.histogram(differs, ABS_EDGES)[0]
        moved = abs_err != 0
        flat = worst_index(ranked, moved)
        if ranked.flat[flat] > 0 and replaces_worst(float(ranked.flat[flat]), bool(moved.flat[flat]), worst[0], worst_moved):
            r, c = np.unravel_index(flat, ulp.shape)
            worst, worst_moved = (float(ranked.flat[flat]), start + int(r), int(c)), bool(moved.flat[flat])
        images["native"].append(block_mean(values_n, factors))
        images["oracle"].append(block_mean(values_o, factors))
        with np.errstate(over="ignore", invalid="ignore"):  # an error past float32's range shows as inf, as it is
            images["absolute"].append(block_max(np.asarray(abs_err, dtype=np.float32), factors))
            images["relative"].append(block_max(np.asarray(rel_err, dtype=np.float32), factors))
            images["ULP"].append(block_max(np.log2(1.0 + ulp).astype(np.float32), factors))
        yield Progress(stop, n2.shape[0], label)
    joined = {k: finite_for_display(np.concatenate(v, axis=0)) for k, v in images.items()}
    return _Maps(joined, abs_hist, differing, worst)


def _coloured(images: dict[str, np.ndarray], levels: dict[str, tuple[float, float]]) -> dict[str, np.ndarray]:
    rgba = {side: to_rgba(images[side], levels["values"], VALUE_LUT) for side in ("native", "oracle")}
    rgba.update({scale: to_rgba(images[scale], levels[scale], DIFF_LUT) for scale in ("absolute", "relative", "ULP")})
    return rgba


def _iter_decoded(capture: Capture, record: Record, label: str) -> ProgressGenerator[tuple[np.ndarray, np.ndarray]]:
    """(decoded values as float32 bits in the logical shape, the stored blocks) of a quantized record."""
    yield Progress(0, 1, label)
    raw = capture.read_bits(record)
    values = np.ascontiguousarray(capture.decode_blocks(record, raw), dtype=np.float32)
    yield Progress(1, 1, label)
    return values.view(np.uint32), raw


def _worst_element(metrics: TensorMetrics | None) -> tuple[int, ...] | None:
    """Where the report names the pair's largest error (else its first difference), as a coordinate."""
    if metrics is None:
        return None
    sample = metrics.worst_ulp_at or metrics.first_difference
    return tuple(sample.coord) if sample is not None else None


def iter_prepare(request: TensorRequest) -> ProgressGenerator[TensorSlice]:
    raw_blocks: tuple[np.ndarray, np.ndarray] | None = None
    notes: list[str] = []
    dtype = request.dtype
    if logical_dtype(request.dtype).is_quantized:
        native, native_raw = yield from _iter_decoded(request.native, request.native_side.record, f"decoding native {request.label}")
        oracle, oracle_raw = yield from _iter_decoded(request.oracle, request.oracle_side.record, f"decoding oracle {request.label}")
        raw_blocks, dtype = (native_raw, oracle_raw), "float32"
        notes.append(f"{request.dtype} decoded to float32 for display")
    else:
        native = yield from iter_read_canonical(request.native, request.native_side, f"reading native {request.label}")
        oracle = yield from iter_read_canonical(request.oracle, request.oracle_side, f"reading oracle {request.label}")
    shape = tuple(native.shape)
    spec = request.spec or SliceSpec.default(shape, _worst_element(request.metrics))
    native_cut = np.ascontiguousarray(spec.cut(native))
    oracle_cut = np.ascontiguousarray(spec.cut(oracle))
    n2, o2 = _as_2d(native_cut), _as_2d(oracle_cut)
    factors = block_factors(n2.shape) if native_cut.ndim == 2 else (1, 1)
    maps = yield from _iter_maps(n2, o2, dtype, factors, f"diffing {request.label}")
    joined = maps.images
    if native_cut.ndim == 1:
        joined = {k: v.reshape(-1) for k, v in joined.items()}
    levels = {"values": levels_of(joined["native"], joined["oracle"])}
    levels.update({scale: levels_of(joined[scale], floor=0.0) for scale in ("absolute", "relative", "ULP")})
    rgba = _coloured(joined, levels) if native_cut.ndim == 2 else {}
    worst = maps.worst
    worst_at = None if worst[0] < 0 else ((worst[2],) if native_cut.ndim == 1 else (worst[1], worst[2]))
    return TensorSlice(
        request=request,
        shape=shape,
        spec=spec,
        native_bits=native_cut,
        oracle_bits=oracle_cut,
        factors=factors,
        images=joined,
        abs_hist=maps.abs_hist,
        worst=worst_at,
        levels=levels,
        rgba=rgba,
        differing=maps.differing,
        total=int(native_cut.size),
        dtype=dtype,
        raw_blocks=raw_blocks,
        notes=notes,
    )


@dataclass(frozen=True)
class DetailRegion:
    """A zoomed-in part of a shown 2-D slice, at finer resolution than the whole slice's images."""

    data: TensorSlice
    """The slice it belongs to: a detail of another slice is never shown."""
    rows: tuple[int, int]
    cols: tuple[int, int]
    factors: tuple[int, int]
    rgba: dict[str, np.ndarray]
    """Coloured with the whole slice's levels, so the detail and the image around it agree."""


def detail_bounds(data: TensorSlice, rows: tuple[float, float], cols: tuple[float, float]) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The element rows and columns a view of [rows) x [cols) shows, widened by a quarter on each
    side so small pans stay inside; None unless that region can be drawn at least twice as
    finely as the whole slice's images are (a smaller gain is not worth diffing it again)."""
    if data.is_1d or data.factors == (1, 1):
        return None
    n_rows, n_cols = data.native_bits.shape
    bounds = []
    for (low, high), size in ((rows, n_rows), (cols, n_cols)):
        margin = (high - low) / 4
        start, stop = max(0, int(np.floor(low - margin))), min(size, int(np.ceil(high + margin)))
        if stop <= start:
            return None
        bounds.append((start, stop))
    (r0, r1), (c0, c1) = bounds
    finer = block_factors((r1 - r0, c1 - c0))
    if not any(f * 2 <= d for f, d in zip(finer, data.factors)):
        return None
    return (r0, r1), (c0, c1)


def iter_prepare_detail(data: TensorSlice, rows: tuple[int, int], cols: tuple[int, int]) -> ProgressGenerator[DetailRegion]:
    """The elements of `data` in [rows) x [cols), shrunk only as far as MAX_DISPLAY needs."""
    nb = np.ascontiguousarray(data.native_bits[rows[0] : rows[1], cols[0] : cols[1]])
    ob = np.ascontiguousarray(data.oracle_bits[rows[0] : rows[1], cols[0] : cols[1]])
    factors = block_factors(nb.shape)
    maps = yield from _iter_maps(nb, ob, data.dtype, factors, f"zooming into {data.request.label}")
    return DetailRegion(data, rows, cols, factors, _coloured(maps.images, data.levels))
