"""Reading an aligned pair's canonical rows, both sides, in bounded chunks into reused buffers.

The comparison streams every tensor byte of two captures, so how it reads decides its speed:
each record is checked once (not once per chunk), each chunk lands in a buffer reused for the
whole comparison (a fresh array costs more in page faults than the copy from the page cache),
and the chunk size keeps what was just read in cache while it is compared.
"""

from __future__ import annotations

import math
from functools import lru_cache
from operator import attrgetter

import numpy as np

from sessions.bits.dtypes import logical_dtype
from sessions.capture.reader import (
    Capture,
    RecordReader,
    refuse_bool_bytes,
    stored_span,
)
from sessions.compare.aligned_pairs import AlignedPair, AlignedPairs
from sessions.compare.byte_checks import ByteChecks, FileSpot, Pieces
from sessions.compare.mapped_record import MappedRecord
from sessions.compare.page_release import FileSpan, kept_in_page_cache

ADVISE_MIN_BYTES = 1024 * 1024
"""Smaller records get no read-ahead: finding their span costs about what their read does."""


def pair_bytes(pair: AlignedPair) -> int:
    """Stored bytes of both sides of a pair (of what the pair compares, when it is part of a record)."""
    return _pair_bytes(pair.native.record.dtype, pair.native.shape, pair.native.record.shape)


def pair_byte_counts(pairs: list[AlignedPair]) -> np.ndarray:
    """`pair_bytes` of every pair, worked out once: the total, the read-ahead and the shards of a
    real run's 220,000 pairs each asked for them pair by pair."""
    if isinstance(pairs, AlignedPairs):
        return pairs.per_kind(pair_bytes, np.int64)
    return np.fromiter(map(pair_bytes, pairs), np.int64, len(pairs))


@lru_cache(maxsize=4096)
def _pair_bytes(dtype: str, compared: tuple[int, ...], stored: tuple[int, ...]) -> int:
    """Once per kind of pair: a comparison asks for every pair's bytes (once for `pair_byte_counts`,
    again as each pair's progress), and a real run has 220,000 pairs of a few hundred kinds."""
    ld = logical_dtype(dtype)
    return 2 * math.prod(stored if ld.is_quantized else compared) * ld.storage.itemsize


def _rows_per_unit(mapped: MappedRecord) -> int:
    """Canonical axis-0 rows per index of the stored axis they are read along."""
    return mapped.layout.rows_per_unit(mapped.stored_shape()) if mapped.layout is not None else 1


def chunk_rows(pair: AlignedPair, chunk_bytes: int) -> list[tuple[int, int]] | None:
    """Canonical row ranges to read per step, or None to read the pair whole."""
    record = pair.native.record
    if logical_dtype(record.dtype).is_quantized or not pair.native.shape or not record.shape:
        return None
    rows = pair.native.shape[0]
    row_bytes = max(1, math.prod(pair.native.shape[1:]) * logical_dtype(record.dtype).storage.itemsize)
    if rows * row_bytes <= chunk_bytes:
        return None
    step = math.lcm(_rows_per_unit(pair.native), _rows_per_unit(pair.oracle))
    per_chunk = max(step, (chunk_bytes // row_bytes) // step * step)
    return [(start, min(rows, start + per_chunk)) for start in range(0, rows, per_chunk)]


def read_ahead_spans(
    native: Capture, oracle: Capture, pairs: list[AlignedPair], sizes: np.ndarray
) -> tuple[list[tuple[str, int, int]], list[int]]:
    """The file spans a comparison of `pairs` (of `sizes`: `pair_byte_counts`) reads, in its
    order (each pair's native, then its oracle data), and for each pair the span bytes read once
    it is done."""
    spans: list[tuple[str, int, int]] = []
    read = np.zeros(len(pairs), dtype=np.int64)
    for index in np.flatnonzero(sizes // 2 >= ADVISE_MIN_BYTES).tolist():
        for capture, mapped in ((native, pairs[index].native), (oracle, pairs[index].oracle)):
            span = stored_span(capture, mapped.record)
            if span is not None:
                spans.append((str(capture.path), *span))
                read[index] += span[1]
    return spans, np.cumsum(read).tolist()


class _Side:
    """One capture's side of the comparison: its open record and its reused byte buffer."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self._buffer = np.empty(0, dtype=np.uint8)
        self._mapped: MappedRecord | None = None
        self._reader: RecordReader | None = None

    def use(self, mapped: MappedRecord) -> None:
        self._mapped, self._reader = mapped, None

    def _array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        need = math.prod(shape) * dtype.itemsize
        if self._buffer.size < need:
            self._buffer = np.empty(0, dtype=np.uint8)  # drop the old buffer before the larger one exists
            self._buffer = np.empty(need, dtype=np.uint8)
        return self._buffer[:need].view(dtype).reshape(shape)

    def _stored(self, selection: tuple[slice, ...] | None) -> np.ndarray:
        assert self._mapped is not None
        record = self._mapped.record
        ld = logical_dtype(record.dtype)
        if ld.is_quantized:
            return self.capture.read_bits(record, selection)
        if self._reader is None:
            self._reader = RecordReader(self.capture, record)
        shape = record.shape if selection is None else tuple(len(range(*s.indices(n))) for s, n in zip(selection, record.shape))
        return self._reader.read_into(self._array(shape, ld.storage), selection)

    def whole_from(self, stored: np.ndarray) -> np.ndarray | None:
        """`whole()` of the record's stored bytes already read (uint8, its whole contiguous run),
        or None when they are not the record's size (then `whole()` reads and says why)."""
        assert self._mapped is not None
        record = self._mapped.record
        ld = logical_dtype(record.dtype)
        if ld.is_quantized:
            return stored if stored.size == record.nbytes else None
        if stored.size != math.prod(record.shape) * ld.storage.itemsize:
            return None
        refuse_bool_bytes(self.capture.path, record, stored)
        return self._mapped.canonical(stored.view(ld.storage).reshape(record.shape))

    def whole(self) -> np.ndarray:
        assert self._mapped is not None
        if logical_dtype(self._mapped.record.dtype).is_quantized:
            return self._stored(None).reshape(-1)
        return self._mapped.canonical(self._stored(self._mapped.selection()))

    def rows(self, rows: tuple[int, int]) -> np.ndarray:
        """Canonical rows [start, stop) of what the pair compares: the stored slice, then the layout transform."""
        assert self._mapped is not None
        return self._mapped.canonical(self._stored(self._mapped.selection(rows)))


class PairReader:
    """Reads pair after pair of two open captures; a returned chunk is valid until that side's
    next read (whoever keeps data past that copies it)."""

    def __init__(self, native: Capture, oracle: Capture, checks: ByteChecks | None = None) -> None:
        """`checks`: the caller's checks of stored bytes (and their threads), which the caller
        closes; None: the reader's own, on one thread."""
        self.native = _Side(native)
        self.oracle = _Side(oracle)
        for capture in (native, oracle):
            # Found here, once, not inside the first pair: a comparison that times its first pairs
            # to decide on workers took the table's 0.17 s (240,000 rows) for slow comparing.
            capture.packed_addresses  # noqa: B018
        self._own_checks = checks is None
        self.checks = ByteChecks(1, kept_in_page_cache(native.descriptor, oracle.descriptor)) if checks is None else checks
        self._pieces: Pieces | None = None
        """This reader's own, not the checks' pieces for its thread: a check ahead would overwrite the
        bytes `held_bytes` hands out."""
        self._held = 0
        """How many bytes of each side the pieces hold whole, from the last `stored_bytes_equal`."""

    def stored_bytes_equal(self, native: FileSpot, oracle: FileSpot, size: int) -> bool:
        """Whether `size` bytes at `native` and `oracle` are equal (`Pieces`); one piece or less is
        read into this reader's own pieces and held there for `held_bytes`, a longer stretch is
        compared on the reader's threads (`ByteChecks.equal`)."""
        self._held = 0
        if self.checks.known.covers(native, oracle, size):
            return True
        if self._pieces is None:
            self._pieces = Pieces()
        if size > self._pieces.size:
            return self.checks.equal(native, oracle, size)
        if not self._pieces.read(native, oracle, size):
            return False
        self._held = size
        if not self._pieces.same(size):
            return False
        self.checks.let_go(native, oracle, size)
        return True

    def held_bytes(self, size: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Both sides' `size` bytes as the last `stored_bytes_equal` read them, when it read them
        whole in one piece; valid until its next call. A small pair whose bytes differ is then
        compared from them rather than read again (its reads cost a quarter of a 128-byte diverged pair)."""
        if self._pieces is None or self._held != size:
            return None
        return np.frombuffer(self._pieces.native, np.uint8, size), np.frombuffer(self._pieces.oracle, np.uint8, size)

    def close(self) -> None:
        """Stop the reader's own checks' threads (checks not yet begun are dropped)."""
        if self._own_checks:
            self.checks.close()

    def __enter__(self) -> PairReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def use(self, pair: AlignedPair) -> None:
        """Make `pair` the one read; its records are checked on their first read."""
        self.native.use(pair.native)
        self.oracle.use(pair.oracle)

    def done_with(self, pair: AlignedPair, last_reads: tuple[bool, bool]) -> None:
        """`pair`, compared element by element, lets its stored bytes go of the page cache past
        what is kept (`ByteChecks.done_with`) on each side whose record no later pair of this
        comparison reads (`last_reads`: native, oracle). A record cut into windows of positions
        is read by several pairs and goes with the last of them; a batched run's record is read
        for its one request's row, and goes whole. A diverged run larger than memory kept every
        byte it compared, and a run cut differently every record it compared in windows (a real
        prefill's, most of its bytes): the kernel reclaimed a page for each page read."""
        if self.checks.keeps_all:
            return
        spans: list[FileSpan | None] = [None, None]
        for at, (side, mapped, last) in enumerate(((self.native, pair.native, last_reads[0]), (self.oracle, pair.oracle, last_reads[1]))):
            descriptor = side.capture.descriptor
            if last and descriptor is not None:
                span = stored_span(side.capture, mapped.record)
                spans[at] = None if span is None else (descriptor, *span)
        self.checks.done_with(*spans)


RecordSeqs = tuple[np.ndarray, np.ndarray]
"""Each pair's native and oracle record seq, row for row with the pairs (`record_seqs`)."""


def record_seqs(pairs: list[AlignedPair]) -> RecordSeqs:
    """Found once per comparison of `pairs`: its runs of small records and its last reads both ask."""
    if isinstance(pairs, AlignedPairs):
        return pairs.seqs
    native, oracle = (np.fromiter(map(attrgetter(f"{side}.record.seq"), pairs), np.int64, len(pairs)) for side in ("native", "oracle"))
    return native, oracle


def last_reads(seqs: RecordSeqs) -> list[tuple[bool, bool]]:
    """For each pair (of `seqs`: `record_seqs`), whether it is the last of them to read its native
    record, and its oracle record: a record cut into windows of positions is read by several
    pairs (runs cut differently), which may lie far apart in the run (one window per segment).
    The pairs are one `iter_compare_pairs` call's, a shard's when processes share the comparison
    (`parallel_compare`): a record whose windows fall in two shards goes with the last of each,
    and the second reads it from the disk again."""
    flags = []
    for side in seqs:
        last = np.zeros(len(side), dtype=bool)
        _, from_end = np.unique(side[::-1], return_index=True)
        last[len(side) - 1 - from_end] = True
        flags.append(last.tolist())
    return list(zip(*flags))
