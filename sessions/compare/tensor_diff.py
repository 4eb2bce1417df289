"""Bit-level difference metrics of one aligned tensor pair, accumulated chunk by chunk.

Everything starts from the stored bits: a pair is bit-exact only if every pattern matches,
and each kind of bit difference (signed zero, NaN payload, Inf sign, ULP flips) is counted
on its own. Value metrics (abs/rel error, RMSE, NMSE, cosine) are computed in float64 over
positions where both values are finite; non-finite mismatches are counted instead. A
tolerance only decides the verdict -- it never removes a difference from the counts.

Chunks arrive in canonical layout, sliced along axis 0, so a multi-GB tensor is never held
whole. Most of a long run is bit-identical, so each chunk is compared block by block on its
bits first (a memcmp-speed pass), and the per-element work (ULP, NaN/Inf classes, errors,
samples, profiles) runs only on the positions where the bits differ. The sums NMSE and cosine
need (the oracle's squares: where the bits match, native == oracle) are taken only when they
can matter, in float64 over cache-sized blocks: a pair that stays bit-identical needs none,
since its RMSE, NMSE and cosine are 0, 0 and 1 by definition.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache, lru_cache

import numpy as np

from sessions.bits.dtypes import as_bit_pattern, as_values, logical_dtype
from sessions.bits.element_info import describe
from sessions.bits.ulp import (
    any_special,
    inf_mask,
    is_float_dtype,
    nan_mask,
    ulp_distance,
    ulp_size,
)

EXACT_P99_DISTINCT_LIMIT = 100_000
"""Past this many distinct ULP values, p99 is reported as a histogram bucket edge."""
BLOCK_ELEMENTS = 1 << 18
"""Elements compared, and summed, per step: cache-sized, and it bounds the float64 temporaries
of the differing elements."""
DENSE_PROFILE_FRACTION = 8
"""A pair whose differing elements are at least 1/8 of it is profiled densely."""


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """The sum of a * b by numpy's pairwise summation, never BLAS: OpenBLAS splits a long dot
    product over its threads, so its last bits followed the machine's core count (one vector:
    ...628167 with one thread, ...628188 with two). These sums are NMSE and cosine, which read
    the same on a laptop and on a CI machine."""
    return float(np.multiply(a, b).sum())


@dataclass(frozen=True)
class Tolerance:
    """Optional, explicit acceptance bounds. All None means the verdict is bit-exact.

    An element is within tolerance when its bits match, or when both values are finite and every
    bound given holds: |native - oracle| <= atol + rtol * |oracle| when atol or rtol is given
    (numpy.isclose form, the other one 0), and a ULP distance of at most max_ulp when that is
    given. NaN/Inf mismatches never are.
    """

    atol: float | None = None
    rtol: float | None = None
    max_ulp: int | None = None

    @property
    def is_bit_exact(self) -> bool:
        return self.atol is None and self.rtol is None and self.max_ulp is None


@dataclass
class ElementSample:
    """One element of a pair: canonical coordinate and both stored values, as bits and text."""

    coord: list[int]
    native_hex: str
    native_decimal: str
    oracle_hex: str
    oracle_decimal: str
    ulp: int | None = None


@dataclass
class AxisProfile:
    """Per-index differing counts and max ULP along one canonical axis (rows or heads)."""

    axis: str
    differing: list[int]
    max_ulp: list[int]


SPECIAL_ELEMENTS = (
    ("nan_mismatch", "a NaN against a number"),
    ("nan_payload", "a NaN against a NaN of other bits"),
    ("inf_mismatch", "an infinity against another value"),
)
"""The differing elements an error figure cannot measure, by the count that holds them
(`TensorMetrics`), in the words every surface says them with."""


@dataclass
class TensorMetrics:
    dtype: str
    shape: list[int]
    size: int
    differing: int = 0
    max_ulp: int | None = None
    """The most representable steps between a native and an oracle value (-0 to +0 is 1)."""
    max_ulp_error: float | None = None
    """The largest standard ULP error, |native - oracle| in units of the oracle value's ULP, over
    both-finite differing elements. An oracle zero makes it astronomical (its ULP is the smallest
    subnormal), so it is shown beside the p99, not ranked by."""
    p99_ulp_error: float | None = None
    """The 99th percentile of that ULP error over the differing both-finite elements, to within
    9% (the upper edge of an eighth-of-an-octave bucket, never above the largest error): what ranks ops usefully. Values that
    flip sign near zero read as ~30,000 representable steps in bf16 but tens of ULPs of error."""
    p99_ulp: int | None = None
    p99_exact: bool = True
    ulp_histogram: list[int] = field(default_factory=list)
    """Counts of differing, non-NaN elements: index 0 = 1 ULP, index k = (2^(k-1), 2^k] ULP."""
    signed_zero_only: int = 0
    nan_mismatch: int = 0
    """Positions where exactly one side is NaN."""
    nan_payload: int = 0
    """Positions where both are NaN with different bits (payload or sign)."""
    inf_mismatch: int = 0
    """Positions where one side is +-Inf and the bits differ (Inf sign flips included)."""
    inf_sign: int = 0
    """Positions where both are Inf of opposite sign."""
    max_abs_error: float = 0.0
    max_abs_at: ElementSample | None = None
    max_rel_error: float = 0.0
    max_rel_at: ElementSample | None = None
    rmse: float = 0.0
    nmse: float = 0.0
    """llama.cpp's definition: sum((oracle - native)^2) / sum(oracle^2)."""
    cosine: float = 1.0
    """<native, oracle> / (|native| |oracle|) over both-finite elements. 1 for a bit-identical
    pair, all-zero ones included, and for two zero vectors; 0 when only one side is zero."""
    first_difference: ElementSample | None = None
    worst_ulp_at: ElementSample | None = None
    beyond_tolerance: int = 0
    first_beyond_tolerance: ElementSample | None = None
    per_row: AxisProfile | None = None
    per_head: AxisProfile | None = None

    @classmethod
    def identical(cls, logical: str, shape: tuple[int, ...]) -> "TensorMetrics":
        """What `DiffAccumulator.finish` gives for two bit-identical tensors, without a pass over
        them: for the many small records a comparison already knows are identical byte for byte."""
        exact_ulps = 0 if not logical_dtype(logical).is_quantized else None
        return cls(logical, list(shape), math.prod(shape), max_ulp=exact_ulps, p99_ulp=exact_ulps)

    @property
    def bit_exact(self) -> bool:
        return self.differing == 0

    @property
    def beyond_elsewhere(self) -> ElementSample | None:
        """The first element beyond tolerance when it is not the first that differs: then a
        tolerance allowed the first difference, and what broke it is elsewhere (a NaN past a
        10-ULP bound). Every surface names it then, and only then."""
        beyond = self.first_beyond_tolerance
        if beyond is None or (self.first_difference is not None and beyond.coord == self.first_difference.coord):
            return None
        return beyond

    @property
    def unit(self) -> str:
        """What `size` and `differing` count: a quantized record's stored bytes ("136 of 128
        elements differ" counted bytes against elements), else elements."""
        return "bytes" if logical_dtype(self.dtype).is_quantized else "elements"

    @property
    def fraction_differing(self) -> float:
        return self.differing / self.size if self.size else 0.0


def _widened(bits: np.ndarray, logical_dtype_name: str) -> np.ndarray:
    """Stored bits as float64 values. Widening a signalling NaN (0x7f81 in bfloat16) raises the
    floating-point invalid flag, which numpy reports as a RuntimeWarning; NaNs are masked
    wherever these values are used, so the flag says nothing here."""
    with np.errstate(invalid="ignore"):
        return as_values(bits, logical_dtype_name).astype(np.float64)


def worst_index(ulp: np.ndarray, moved: np.ndarray) -> int:
    """The flat index of the largest ULP distance. A +0/-0 swap is one ULP, as far as a value
    one representable step away; of equally distant elements, one whose value `moved` is named,
    so the report and the viewer point at the same element."""
    flat_ulp, flat_moved = ulp.reshape(-1), moved.reshape(-1)
    worst = int(np.argmax(flat_ulp))
    if not flat_moved[worst]:
        ties = np.flatnonzero((flat_ulp == flat_ulp[worst]) & flat_moved)
        worst = int(ties[0]) if ties.size else worst
    return worst


def replaces_worst(ulp: float, moved: bool, worst_ulp: float | None, worst_moved: bool) -> bool:
    """Whether an element `ulp` apart takes the worst place from the one found before it (in an
    earlier block or chunk): it is farther, or as far while its value `moved` and the other's did
    not (a +0/-0 swap); `worst_index` within a block."""
    return worst_ulp is None or ulp > worst_ulp or (ulp == worst_ulp and moved and not worst_moved)


def element_maps(
    native_bits: np.ndarray, oracle_bits: np.ndarray, logical_dtype_name: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Element-wise (abs_err, rel_err, ulp) float64 maps of two same-shape stored-bit arrays.

    Where the bits match, all three are 0 (identical NaNs included). Where they differ:
    abs_err = |native - oracle| (inf if an Inf is involved, NaN if a NaN is), rel_err =
    abs_err / |oracle| (inf when the oracle is 0), ulp = the ULP distance (1 for -0 vs +0;
    NaN where a NaN makes it undefined). Quantized block formats are rejected.
    """
    if native_bits.shape != oracle_bits.shape:
        raise ValueError(f"shapes differ: {native_bits.shape} vs {oracle_bits.shape}")
    same = as_bit_pattern(native_bits, logical_dtype_name) == as_bit_pattern(oracle_bits, logical_dtype_name)
    a = _widened(native_bits, logical_dtype_name)
    b = _widened(oracle_bits, logical_dtype_name)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        abs_err = np.abs(a - b)
        inf_involved = ~same & (np.isinf(a) | np.isinf(b)) & ~(np.isnan(a) | np.isnan(b))
        abs_err[inf_involved] = np.inf
        rel_err = np.where(abs_err == 0, 0.0, abs_err / np.abs(b))
        rel_err[inf_involved] = np.inf
    ulp = ulp_distance(native_bits, oracle_bits, logical_dtype_name).astype(np.float64)
    if is_float_dtype(logical_dtype_name):
        ulp[nan_mask(native_bits, logical_dtype_name) | nan_mask(oracle_bits, logical_dtype_name)] = np.nan
    abs_err[same] = 0.0
    rel_err[same] = 0.0
    ulp[same] = 0.0
    return abs_err, rel_err, ulp


ERROR_BUCKETS_PER_OCTAVE = 8
ERROR_BUCKET_OFFSET = 4 * ERROR_BUCKETS_PER_OCTAVE
"""Bucket 0 holds ULP errors up to 2^-4; every finite float64 error fits under 2^1100."""
ERROR_BUCKETS = ERROR_BUCKET_OFFSET + 1100 * ERROR_BUCKETS_PER_OCTAVE


def _error_bucket(error: np.ndarray) -> np.ndarray:
    """Bucket k holds errors in (2^((k-1-offset)/8), 2^((k-offset)/8)]. Errors are never NaN (both
    values are finite and a ULP is never 0); a zero error's -inf and an overflow's inf are clipped."""
    with np.errstate(divide="ignore"):
        scaled = np.log2(error)
    scaled *= ERROR_BUCKETS_PER_OCTAVE
    np.ceil(scaled, out=scaled)
    scaled += ERROR_BUCKET_OFFSET - 1
    np.clip(scaled, 0, ERROR_BUCKETS - 1, out=scaled)
    return scaled.astype(np.int64)


@lru_cache(maxsize=1 << 16)
def _shown(pattern: int, logical: str) -> tuple[str, str]:
    """(hex, decimal) of a stored bit pattern, as a sample shows it: once per pattern (a 16-bit
    dtype has 65,536), not once per sample."""
    info = describe(pattern, logical)
    return info.hex, info.decimal


def _histogram_bucket(ulp: np.ndarray) -> np.ndarray:
    """Bucket k holds ULP distances in (2^(k-1), 2^k]; exact for distances up to 2^53."""
    _, exponent = np.frexp((ulp - np.uint64(1)).astype(np.float64))
    return np.minimum(exponent, 64)


def _distinct_counts(values: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ULP distances of `values` (largest `top`) and how often each occurs. Small
    distances, all a near-parity pair has, are counted by `bincount`, which does not sort."""
    if top < max(values.size, 1024):
        counts = np.bincount(values.view(np.int64), minlength=top + 1)
        distinct = np.flatnonzero(counts)
        return distinct.astype(np.uint64), counts[distinct]
    return np.unique(values, return_counts=True)


@cache
def _memcmp() -> Callable[[int, int, int], int] | None:
    """The C library's memcmp, or None where ctypes cannot load it (then numpy compares)."""
    try:
        import ctypes

        function = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, ImportError, TypeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return function  # type: ignore[no-any-return]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit equality of two same-dtype C-contiguous arrays.

    memcmp runs at memory speed (about 1.5x numpy's array_equal, which also writes a bool per
    element); most of a long run is bit-identical, so this is the loop every byte goes through.
    """
    memcmp = _memcmp()
    if memcmp is not None and a.flags.c_contiguous and b.flags.c_contiguous:
        return a.nbytes == b.nbytes and memcmp(a.ctypes.data, b.ctypes.data, a.nbytes) == 0
    if a.nbytes % 8 == 0 and a.flags.c_contiguous and b.flags.c_contiguous:
        return bool(np.array_equal(a.reshape(-1).view(np.uint64), b.reshape(-1).view(np.uint64)))
    return bool(np.array_equal(a, b))


def _differing_positions(a: np.ndarray, b: np.ndarray) -> Iterator[np.ndarray]:
    """Flat indices where two 1-D bit arrays differ, one array per differing block, in order.
    Identical arrays cost one memcmp; identical blocks one each."""
    if _same_bits(a, b):
        return
    for start in range(0, a.size, BLOCK_ELEMENTS):
        stop = min(a.size, start + BLOCK_ELEMENTS)
        if not _same_bits(a[start:stop], b[start:stop]):
            yield np.flatnonzero(a[start:stop] != b[start:stop]) + start


def _axis_index(flat: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """The coordinate along `axis` of each flat C-order index: one division and one remainder,
    where `np.unravel_index` works out every axis."""
    inner = math.prod(shape[axis + 1 :])
    index = flat // inner if inner > 1 else flat
    return index % shape[axis] if axis > 0 else index


class _Squares:
    """Sum of squares and count of the finite values of a chunk's stored bits, block by block.

    Only pairs that differ need these sums (see DiffAccumulator), so they are taken accurately
    rather than at BLAS speed -- a float32 dot over 2^18 squares is already off by ~4e-6:
    16-bit floats are widened exactly into a reused float32 block (bfloat16 by a 16-bit shift,
    which is what the format is), where their squares are exact, and summed in float64;
    float32 and integers are converted to float64 and summed by a float64 dot; float64 is used
    as stored. A block whose total is not finite (Inf/NaN in it, or float64 overflow) is
    redone over its finite values.
    """

    def __init__(self, logical: str) -> None:
        self.logical = logical
        self._scratch: np.ndarray | None = None

    def _block_sum(self, block: np.ndarray) -> tuple[float, np.ndarray]:
        """(sum of squares, the block's values) -- the values for the non-finite fallback."""
        if self.logical == "float64":
            values = block.view(np.float64)
            return _dot(values, values), values
        if self._scratch is None or self._scratch.size < block.size:
            self._scratch = np.empty(min(BLOCK_ELEMENTS, max(block.size, 1)), dtype=np.float64)
        if self.logical in ("bfloat16", "float16"):
            wide = self._scratch.view(np.uint32)[: block.size]
            if self.logical == "bfloat16":
                np.left_shift(block, 16, out=wide, dtype=np.uint32)
            else:
                np.copyto(wide.view(np.float32), block.view(np.float16))
            values = wide.view(np.float32)
            squares = self._scratch.view(np.float32)[block.size : 2 * block.size]
            np.square(values, out=squares)
            return float(squares.sum(dtype=np.float64)), values
        wide64 = self._scratch[: block.size]
        np.copyto(wide64, as_values(block, self.logical))
        return _dot(wide64, wide64), wide64

    def of(self, bits: np.ndarray) -> tuple[float, int]:
        flat = bits.reshape(-1)
        total, count = 0.0, 0
        for start in range(0, flat.size, BLOCK_ELEMENTS):
            with np.errstate(over="ignore", invalid="ignore"):
                block_total, values = self._block_sum(flat[start : start + BLOCK_ELEMENTS])
            if np.isfinite(block_total):
                total, count = total + block_total, count + int(values.size)
                continue
            finite = values[np.isfinite(values)].astype(np.float64)
            with np.errstate(over="ignore"):  # float64 values whose squares pass its largest: their sum is inf
                total, count = total + _dot(finite, finite), count + int(finite.size)
        return total, count


class DiffAccumulator:
    """Metrics of one pair, fed canonical-layout chunks in axis-0 order.

    `rows_axis` and `head_split` (axis, heads) select the per-row and per-head profiles;
    heads split their axis into equal contiguous groups ([rows, heads*dim] has axis 1 split).

    `reread_oracle(start, stop)`, when given, returns the oracle's canonical rows [start, stop)
    again. The squares of bit-identical chunks that arrive before any difference are then left
    out, and only if a later chunk differs are those rows read back and summed (oracle side
    only); a multi-chunk pair that stays identical -- most pairs of a long run -- costs one
    compare pass and nothing more. Without it, each such chunk is summed as it arrives.
    """

    def __init__(
        self,
        logical: str,
        shape: tuple[int, ...],
        tolerance: Tolerance,
        rows_axis: int | None = None,
        head_split: tuple[int, int] | None = None,
        reread_oracle: Callable[[int, int], np.ndarray] | None = None,
    ) -> None:
        self.logical = logical
        self.shape = shape
        self.tolerance = tolerance
        self.rows_axis = rows_axis
        self.head_split = head_split
        self._quantized = logical_dtype(logical).is_quantized
        self._float = is_float_dtype(logical)
        self.metrics = TensorMetrics(logical, list(shape), int(math.prod(shape)))
        self._ulp_counts: Counter[int] = Counter()
        self._ulp_values_exact = True
        self._hist = np.zeros(65, dtype=np.int64)
        self._error_buckets: Counter[int] = Counter()
        """Counts of the ULP errors' buckets (`_error_bucket`): a handful of the 8,832 are used."""
        self._nan_positions = 0
        self._sum_sq_diff = 0.0
        self._sum_aa = 0.0
        self._sum_bb = 0.0
        self._sum_ab = 0.0
        self._finite = 0
        self._row_diff: np.ndarray | None = None
        self._row_ulp: np.ndarray | None = None
        self._head_diff: np.ndarray | None = None
        self._head_ulp: np.ndarray | None = None
        self._squares = _Squares(logical)
        self._reread_oracle = reread_oracle
        self._unsummed: list[tuple[int, int]] = []
        """Row ranges of identical chunks whose squares are still missing (see reread_oracle)."""
        self._worst_moved = False
        """Whether the element `worst_ulp_at` names differs in value, not only in the sign of a zero."""
        self._samples: dict[tuple[int, int], ElementSample] = {}
        """Samples made, by (chunk's first row, flat index in the chunk): `_sample`."""

    def _sample(self, native: np.ndarray, oracle: np.ndarray, flat: int, row0: int, ulp: int | None) -> ElementSample:
        """One element's sample, made once however many metrics point at it (in a small pair the
        first difference is often also the worst ULP, abs and rel error and the first beyond
        tolerance): the samples were most of a small differing pair's cost."""
        made = self._samples.get((row0, flat))
        if made is not None:
            return made
        # A scalar's chunk arrives as one element of one axis; its coordinate is [], as its shape is.
        coord = [int(c) for c in np.unravel_index(flat, native.shape)] if self.metrics.shape else []
        if coord:
            coord[0] += row0
        n_hex, n_decimal = _shown(int(as_bit_pattern(native, self.logical).reshape(-1)[flat]), self.logical)
        o_hex, o_decimal = _shown(int(as_bit_pattern(oracle, self.logical).reshape(-1)[flat]), self.logical)
        made = self._samples[(row0, flat)] = ElementSample(coord, n_hex, n_decimal, o_hex, o_decimal, ulp)
        return made

    def add(self, native_bits: np.ndarray, oracle_bits: np.ndarray, row0: int = 0) -> None:
        """Feed the canonical-layout chunk that starts at index `row0` of axis 0.

        The chunk may be a view of a buffer the caller reuses: nothing here keeps it.
        """
        if native_bits.shape != oracle_bits.shape:
            raise ValueError(f"chunk shapes differ: {native_bits.shape} vs {oracle_bits.shape}")
        native_bits = np.ascontiguousarray(native_bits)
        oracle_bits = np.ascontiguousarray(oracle_bits)
        a = as_bit_pattern(native_bits, self.logical).reshape(-1)
        b = as_bit_pattern(oracle_bits, self.logical).reshape(-1)
        differed_before = self.metrics.differing > 0
        differed = False
        for flat in _differing_positions(a, b):
            differed = True
            self.metrics.differing += int(flat.size)
            if self._quantized:
                self._add_quantized(a, b, flat, native_bits.shape)
            else:
                # float64 values near its largest overflow what is taken of them (a sign flip of
                # 1.7e308 differs by 3.4e308): inf, as such an error is, not a warning.
                with np.errstate(over="ignore", invalid="ignore"):
                    self._add_differing(native_bits, oracle_bits, a[flat], b[flat], flat, row0)
        if self._quantized:
            return
        if differed or differed_before:
            # Every element enters as if native == oracle (b*b); _correct_sums has already
            # replaced the differing elements' share.
            self._add_squares(oracle_bits)
        elif native_bits.size != self.metrics.size:
            if self._reread_oracle is None:
                self._add_squares(oracle_bits)
            else:
                self._unsummed.append((row0, row0 + native_bits.shape[0]))

    def _add_squares(self, oracle_bits: np.ndarray) -> None:
        squares, finite = self._squares.of(oracle_bits)
        self._finite += finite
        self._sum_aa += squares
        self._sum_bb += squares
        self._sum_ab += squares

    def _add_quantized(self, a: np.ndarray, b: np.ndarray, flat: np.ndarray, shape: tuple[int, ...]) -> None:
        """Quantized blocks have no element values: differing bytes count, each one beyond tolerance."""
        m = self.metrics
        if m.first_difference is None:
            first = int(flat[0])
            m.first_difference = ElementSample(
                [int(c) for c in np.unravel_index(first, shape)],
                f"0x{int(a[first]):02x}", "", f"0x{int(b[first]):02x}", "",
            )
        m.beyond_tolerance += int(flat.size)

    def _add_differing(self, native_bits: np.ndarray, oracle_bits: np.ndarray, nb: np.ndarray, ob: np.ndarray, flat: np.ndarray, row0: int) -> None:
        """Metrics from the differing elements only (`flat` indexes them); sums use the whole chunk."""
        m = self.metrics
        ulp = ulp_distance(nb, ob, self.logical)
        special = self._float and (any_special(nb, self.logical) or any_special(ob, self.logical))
        if special:
            nan_a, nan_b = nan_mask(nb, self.logical), nan_mask(ob, self.logical)
            inf_a, inf_b = inf_mask(nb, self.logical), inf_mask(ob, self.logical)
            any_nan = nan_a | nan_b
            m.nan_mismatch += int(np.count_nonzero(nan_a ^ nan_b))
            m.nan_payload += int(np.count_nonzero(nan_a & nan_b))
            m.inf_mismatch += int(np.count_nonzero((inf_a | inf_b) & ~any_nan))
            m.inf_sign += int(np.count_nonzero(inf_a & inf_b))
            self._nan_positions += int(np.count_nonzero(any_nan))
        else:
            any_nan = np.zeros(flat.shape, dtype=bool)
        va = _widened(nb, self.logical)
        vb = _widened(ob, self.logical)
        finite = np.isfinite(va) & np.isfinite(vb) if special else np.ones(flat.shape, dtype=bool)
        all_finite = not special or bool(finite.all())
        if self._float:
            m.signed_zero_only += int(np.count_nonzero((va == 0) & (vb == 0)))
        self._correct_sums(va, vb, finite, all_finite)
        if all_finite:
            abs_err = np.abs(va - vb)
            error = abs_err / ulp_size(ob, self.logical)
        else:
            abs_err = np.where(finite, np.abs(np.where(finite, va, 0.0) - np.where(finite, vb, 0.0)), 0.0)
            error = abs_err[finite] / ulp_size(ob[finite], self.logical)
        if error.size:
            top = float(error.max())
            m.max_ulp_error = top if m.max_ulp_error is None else max(m.max_ulp_error, top)
            counts = np.bincount(_error_bucket(error))
            used = np.flatnonzero(counts)
            self._error_buckets.update(dict(zip(used.tolist(), counts[used].tolist())))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_err = np.where(abs_err == 0, 0.0, abs_err / np.abs(vb))
        ulp_or_none = [None if bad else int(u) for u, bad in zip(ulp[:1], any_nan[:1])]
        if m.first_difference is None:
            m.first_difference = self._sample(native_bits, oracle_bits, int(flat[0]), row0, ulp_or_none[0])
        for which, err in (("abs", abs_err), ("rel", rel_err)):
            k = int(np.argmax(err))
            value = float(err[k])
            if value > (m.max_abs_error if which == "abs" else m.max_rel_error):
                sample = self._sample(native_bits, oracle_bits, int(flat[k]), row0, None if any_nan[k] else int(ulp[k]))
                if which == "abs":
                    m.max_abs_error, m.max_abs_at = value, sample
                else:
                    m.max_rel_error, m.max_rel_at = value, sample
        self._add_ulps(native_bits, oracle_bits, ulp, ~any_nan if special else None, flat, row0, abs_err > 0)
        self._add_tolerance(native_bits, oracle_bits, finite, abs_err, vb, ulp, any_nan, flat, row0)
        self._add_profiles(native_bits.shape, flat, ulp, row0)  # 0 where a NaN is: `ulp_distance`

    def _correct_sums(self, va: np.ndarray, vb: np.ndarray, finite: np.ndarray, all_finite: bool) -> None:
        """The chunk's sums were started as if native == oracle (every element adds b*b); replace
        the differing elements' share with their true a*a, b*b, a*b over both-finite positions."""
        if all_finite:
            removed = _dot(vb, vb)
            fa, fb = va, vb
        else:
            b_finite = np.isfinite(vb)
            removed = _dot(vb[b_finite], vb[b_finite])
            fa, fb = va[finite], vb[finite]
            self._finite += int(fa.size) - int(np.count_nonzero(b_finite))
        delta = fa - fb
        self._sum_sq_diff += _dot(delta, delta)
        self._sum_aa += _dot(fa, fa) - removed
        self._sum_bb += _dot(fb, fb) - removed
        self._sum_ab += _dot(fa, fb) - removed

    def _add_ulps(
        self, native_bits: np.ndarray, oracle_bits: np.ndarray, ulp: np.ndarray, counted: np.ndarray | None, flat: np.ndarray, row0: int, moved: np.ndarray
    ) -> None:
        """`counted`: where a ULP distance exists (no NaN on either side); None when it does
        everywhere. `moved`: where the values differ, not only their bits. A +0/-0 swap is one
        representable step, as far as any 1-ULP difference, and was named the worst element
        beside a real one: of equally distant elements, one whose value moved is named."""
        values = ulp if counted is None else ulp[counted]
        if values.size == 0:
            return
        moves = moved if counted is None else moved[counted]
        worst = worst_index(values, moves)
        top = int(values[worst])
        m = self.metrics
        if replaces_worst(top, bool(moves[worst]), m.max_ulp, self._worst_moved):
            m.max_ulp, self._worst_moved = top, bool(moves[worst])
            k = worst if values.size == ulp.size else int(np.flatnonzero(counted)[worst])
            m.worst_ulp_at = self._sample(native_bits, oracle_bits, int(flat[k]), row0, top)
        if not self._ulp_values_exact:
            np.add.at(self._hist, _histogram_bucket(values), 1)
            return
        distinct, counts = _distinct_counts(values, top)
        np.add.at(self._hist, _histogram_bucket(distinct), counts)
        self._ulp_counts.update(dict(zip(distinct.tolist(), counts.tolist())))
        if len(self._ulp_counts) > EXACT_P99_DISTINCT_LIMIT:
            self._ulp_values_exact = False
            self._ulp_counts.clear()

    def _add_tolerance(self, native_bits: np.ndarray, oracle_bits: np.ndarray, finite: np.ndarray, abs_err: np.ndarray, vb: np.ndarray, ulp: np.ndarray, any_nan: np.ndarray, flat: np.ndarray, row0: int) -> None:
        tol = self.tolerance
        if tol.is_bit_exact:
            beyond = np.arange(flat.size)
        else:
            within = finite.copy()
            if tol.atol is not None or tol.rtol is not None:
                bound = (tol.atol or 0.0) + (tol.rtol or 0.0) * np.abs(np.where(finite, vb, 0.0))
                within &= abs_err <= bound
            if tol.max_ulp is not None:
                within &= ulp <= np.uint64(tol.max_ulp)
            beyond = np.flatnonzero(~within)
        m = self.metrics
        if beyond.size and m.first_beyond_tolerance is None:
            k = int(beyond[0])
            m.first_beyond_tolerance = self._sample(native_bits, oracle_bits, int(flat[k]), row0, None if any_nan[k] else int(ulp[k]))
        m.beyond_tolerance += int(beyond.size)

    def _add_profiles(self, chunk_shape: tuple[int, ...], flat: np.ndarray, ulp: np.ndarray, row0: int) -> None:
        """Per-row and per-head differing counts and largest ULPs. A whole small pair where many
        elements differ (a diverged run's records) is profiled densely, by reductions over its
        reshaped axes, which costs less than locating each element's coordinates."""
        profiles = []
        if self.rows_axis is not None:
            if self._row_diff is None or self._row_ulp is None:
                self._row_diff = np.zeros(self.shape[self.rows_axis], dtype=np.int64)
                self._row_ulp = np.zeros(self.shape[self.rows_axis], dtype=np.uint64)
            profiles.append((self.rows_axis, self.shape[self.rows_axis], self._row_diff, self._row_ulp))
        if self.head_split is not None:
            axis, heads = self.head_split
            if self._head_diff is None or self._head_ulp is None:
                self._head_diff = np.zeros(heads, dtype=np.int64)
                self._head_ulp = np.zeros(heads, dtype=np.uint64)
            profiles.append((axis, heads, self._head_diff, self._head_ulp))
        size = math.prod(chunk_shape)
        if size == self.metrics.size and size <= BLOCK_ELEMENTS and flat.size * DENSE_PROFILE_FRACTION >= size:
            differing = np.zeros(size, dtype=bool)
            differing[flat] = True
            dense = np.zeros(size, dtype=np.uint64)
            dense[flat] = ulp
            for axis, groups, counts, top in profiles:
                grouped = chunk_shape[:axis] + (groups, chunk_shape[axis] // groups) + chunk_shape[axis + 1 :]
                others = tuple(i for i in range(len(grouped)) if i != axis)
                counts += np.add.reduce(differing.reshape(grouped), axis=others, dtype=np.int64)
                np.maximum(top, dense.reshape(grouped).max(axis=others), out=top)
            return
        for axis, groups, counts, top in profiles:
            index = _axis_index(flat, chunk_shape, axis) + (row0 if axis == 0 else 0)
            index //= self.shape[axis] // groups
            counts += np.bincount(index, minlength=groups)
            np.maximum.at(top, index, ulp)

    def finish(self) -> TensorMetrics:
        m = self.metrics
        if m.differing and self._reread_oracle is not None:
            for start, stop in self._unsummed:
                self._add_squares(np.ascontiguousarray(self._reread_oracle(start, stop)))
        self._unsummed.clear()
        if self._finite:
            m.rmse = float(np.sqrt(self._sum_sq_diff / self._finite))
        if self._sum_sq_diff:
            m.nmse = self._sum_sq_diff / self._sum_bb if self._sum_bb else float("inf")
        if m.differing:
            norms = np.sqrt(self._sum_aa * self._sum_bb)
            m.cosine = float(self._sum_ab / norms) if norms else (1.0 if self._sum_aa == self._sum_bb else 0.0)
        if not self._quantized:
            self._finish_ulp_stats()
        if self._error_buckets:
            # A float64 error over an oracle zero's ULP (4.9e-324) passes 2^1024: the edge is then inf, not an OverflowError.
            with np.errstate(over="ignore"):
                edge = float(np.exp2((self._p99_error_bucket() + 1 - ERROR_BUCKET_OFFSET) / ERROR_BUCKETS_PER_OCTAVE))
            # The bucket's upper edge, but never above the largest error: a pair whose elements
            # differ only in the sign of zero has errors of 0, whose bucket's edge is 2^(-31/8).
            m.p99_ulp_error = edge if m.max_ulp_error is None else min(edge, m.max_ulp_error)
        used_ulps = np.flatnonzero(self._hist)
        m.ulp_histogram = self._hist[: int(used_ulps[-1]) + 1].tolist() if used_ulps.size else []
        if self._row_diff is not None and self._row_ulp is not None:
            m.per_row = AxisProfile("rows", self._row_diff.tolist(), self._row_ulp.tolist())
        if self._head_diff is not None and self._head_ulp is not None:
            m.per_head = AxisProfile("heads", self._head_diff.tolist(), self._head_ulp.tolist())
        return m

    def _p99_error_bucket(self) -> int:
        """The first bucket at which the ULP errors' cumulative count reaches 99% of them."""
        threshold = 0.99 * sum(self._error_buckets.values())
        cumulative = 0
        for bucket in sorted(self._error_buckets):
            cumulative += self._error_buckets[bucket]
            if cumulative >= threshold:
                break
        return bucket

    def _finish_ulp_stats(self) -> None:
        m = self.metrics
        population = m.size - self._nan_positions
        nonzero = int(self._hist.sum())
        if m.max_ulp is None:
            # No differing element has a ULP distance (each is a NaN against a number or another
            # NaN): none is given, as for quantized bytes. "max 0 ULP" read as if nothing differed.
            if not m.differing:
                m.max_ulp, m.p99_ulp = 0, 0
            return
        rank = int(np.ceil(0.99 * population))
        zeros = population - nonzero
        if rank <= zeros:
            m.p99_ulp = 0
            return
        remaining = rank - zeros
        if self._ulp_values_exact:
            for value in sorted(self._ulp_counts):
                remaining -= self._ulp_counts[value]
                if remaining <= 0:
                    m.p99_ulp = value
                    return
        m.p99_exact = False
        cumulative = np.cumsum(self._hist)
        bucket = int(np.searchsorted(cumulative, remaining))
        m.p99_ulp = 1 << bucket
