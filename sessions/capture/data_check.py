"""`validate --deep`: every tensor's data read, in the checking child, the way a comparison reads it.

The structural check proves a file safe to open from metadata alone; it cannot see a chunk
whose stream is corrupt or inflates past its size, or a B-tree node that only breaks when a
chunk is looked up. Reading every record, slice by slice through `RecordReader` (bounded
decoding, sessions.capture.chunk_read) or whole for quantized blocks, makes "valid" mean "a
report can read it". It runs in the child with the address-space limit, so a read that crashes
libhdf5 ends the child, not the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sessions.bits.dtypes import logical_dtype
from sessions.capture.hdf5_safety import Problem
from sessions.capture.reader import Capture, CaptureError, Record, RecordReader
from sessions.capture.records import record_from_row

SLICE_BYTES = 64 * 1024**2
"""Largest slice of one record read at once: the check's memory stays far below its limit."""
PROGRESS_EVERY_ROWS = 64


def read_record(capture: Capture, record: Record) -> None:
    """Read all of a record's stored data once; raises CaptureError where it cannot be read.

    A record of no elements is read whole: sliced by its first axis it would loop over every
    (empty) row of it."""
    if logical_dtype(record.dtype).is_quantized or not record.shape or record.size == 0:
        capture.read_bits(record)
        return
    reader = RecordReader(capture, record)
    storage = logical_dtype(record.dtype).storage
    row_bytes = max(1, int(np.prod(record.shape[1:], dtype=np.int64)) * storage.itemsize)
    step = max(1, SLICE_BYTES // row_bytes)
    rows = record.shape[0]
    buffer = np.empty((min(rows, step), *record.shape[1:]), dtype=storage)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        reader.read_into(buffer[: stop - start], (slice(start, stop),))


def data_problems(
    capture: Capture, start: int, stop: int, progress: Callable[[int], None] | None = None
) -> list[Problem]:
    """Where index rows start..stop-1 cannot be read, one problem per record; `progress(done)` counts rows."""
    found: list[Problem] = []
    for done, seq in enumerate(range(start, stop)):
        if progress is not None and done % PROGRESS_EVERY_ROWS == 0:
            progress(done)
        try:
            read_record(capture, record_from_row(capture.index[seq]))
        except CaptureError as exc:
            found.append(Problem(exc.location, exc.problem))
    if progress is not None:
        progress(stop - start)
    return found
