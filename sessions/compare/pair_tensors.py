"""Both sides of one compared pair, read back in the canonical layout from the comparison alone.

A `PairResult` names its records (seq and name on each side) and the layout transforms the
comparison applied, so whoever shows a pair later (the viewer, a saved session, a report
reader) needs neither the profiles nor a second alignment -- a user's TOML profile may have
been edited, moved or deleted since. The records are checked against what the comparison
recorded, so a capture rewritten since then is refused instead of showing other bits.
"""

from __future__ import annotations

import numpy as np

from sessions.bits.dtypes import logical_dtype
from sessions.capture.reader import Capture, CaptureError
from sessions.compare.comparison import Comparison, PairResult
from sessions.compare.key import OpKey
from sessions.compare.layout_transform import LayoutError, LayoutTransform
from sessions.compare.mapped_record import MappedRecord, batch_of, canonical_shape
from sessions.gc_pause import garbage_collection_paused
from sessions.progress import Progress, ProgressGenerator, run_to_end

READ_CHUNK_BYTES = 2 * 1024 * 1024
"""Bytes per read: h5py holds the interpreter lock while it reads, so a UI thread waiting on
it gets a turn between chunks."""


def _side(capture: Capture, side: str, seq: int, name: str, spec: str | None, window: tuple[int, int] | None, pair: PairResult) -> MappedRecord:
    """The record the comparison read on one side, as it read it, checked to still be that record."""
    place = f"record seq {seq}"
    record = capture.record(seq)
    if record is None:
        raise CaptureError(capture.path, place, f"is missing; {pair.label} paired {side} {name!r} -- the capture changed since it was compared")
    if record.name != name or record.dtype != pair.metrics.dtype:
        raise CaptureError(
            capture.path, place,
            f"is {record.name!r} ({record.dtype}), but {pair.label} paired {side} {name!r} ({pair.metrics.dtype}) -- the capture changed since it was compared",
        )
    batch = batch_of(capture)
    if logical_dtype(record.dtype).is_quantized:
        return MappedRecord(record, pair.key, None, (record.size,))
    try:
        layout = LayoutTransform.parse(spec) if spec is not None else None
        mapped = MappedRecord(record, pair.key, layout, canonical_shape(record.shape, layout, batch), batch=batch)
    except LayoutError as exc:
        raise CaptureError(capture.path, place, f"cannot be brought to the canonical layout of {pair.label}: {exc}") from None
    if window is not None:
        mapped = mapped.cut(window, pair.key)
    if list(mapped.shape) != list(pair.metrics.shape):
        raise CaptureError(
            capture.path, place,
            f"has canonical shape {list(mapped.shape)}, but {pair.label} compared {list(pair.metrics.shape)} -- the capture changed since it was compared",
        )
    return mapped


def pair_sides(native: Capture, oracle: Capture, pair: PairResult) -> tuple[MappedRecord, MappedRecord]:
    """The (native, oracle) records of a compared pair, as it read them; CaptureError when a
    capture no longer holds what was compared."""
    return (
        _side(native, "native", pair.native_seq, pair.native_name, pair.native_layout, pair.native_window, pair),
        _side(oracle, "oracle", pair.oracle_seq, pair.oracle_name, pair.oracle_layout, pair.oracle_window, pair),
    )


def aligned_records(native: Capture, oracle: Capture, comparison: Comparison) -> tuple[dict[OpKey, MappedRecord], dict[OpKey, MappedRecord]]:
    """Each side's records by the key the comparison paired them under, checked to still be those
    records: whoever reads captured tensors by key (reruns, diagnosis) uses the comparison's
    alignment, so the session's profiles and manual overrides apply there too."""
    native_records: dict[OpKey, MappedRecord] = {}
    oracle_records: dict[OpKey, MappedRecord] = {}
    with garbage_collection_paused(keep_made=True):
        native.records.build_every()
        oracle.records.build_every()
        for pair in comparison.pairs:
            native_records[pair.key], oracle_records[pair.key] = pair_sides(native, oracle, pair)
    return native_records, oracle_records


def iter_read_canonical(capture: Capture, side: MappedRecord, label: str) -> ProgressGenerator[np.ndarray]:
    """What one side of a pair compares, in the canonical layout, read a few MB at a time along
    the stored first axis; yields Progress(rows read, rows). Quantized blocks come back as flat bytes."""
    record = side.record
    if logical_dtype(record.dtype).is_quantized:
        return capture.read_bits(record).reshape(-1)
    selection = side.selection()
    if selection is not None:
        bits = capture.read_bits(record, selection)
        yield Progress(1, 1, label)
    elif len(record.shape) == 0 or record.size == 0:
        bits = capture.read_bits(record)
    else:
        row_bytes = max(1, record.size // record.shape[0]) * logical_dtype(record.dtype).storage.itemsize
        step = max(1, READ_CHUNK_BYTES // row_bytes)
        rows = record.shape[0]
        parts: list[np.ndarray] = []
        for start in range(0, rows, step):
            parts.append(capture.read_bits(record, (slice(start, min(rows, start + step)),)))
            yield Progress(min(rows, start + step), rows, label)
        bits = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    return side.canonical(bits)


def iter_read_pair_bits(native: Capture, oracle: Capture, pair: PairResult) -> ProgressGenerator[tuple[np.ndarray, np.ndarray, str]]:
    """(native bits, oracle bits, logical dtype) of a compared pair in the canonical layout --
    the arrays the comparison compared, coordinates as in its metrics. Raises CaptureError."""
    n_side, o_side = pair_sides(native, oracle, pair)
    native_bits = yield from iter_read_canonical(native, n_side, f"reading native {pair.label}")
    oracle_bits = yield from iter_read_canonical(oracle, o_side, f"reading oracle {pair.label}")
    return native_bits, oracle_bits, n_side.record.dtype


def read_pair_bits(native: Capture, oracle: Capture, pair: PairResult) -> tuple[np.ndarray, np.ndarray, str]:
    """`iter_read_pair_bits` without progress, for headless callers."""
    return run_to_end(iter_read_pair_bits(native, oracle, pair))
