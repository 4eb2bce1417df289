"""Reading a packed record (or a selection of it) from its pack into the caller's buffer.

The comparison reads canonical row ranges of records into buffers it reuses; for a packed
record such a range is a regular run of pack bytes, read by libhdf5 as one hyperslab straight
into that buffer (no temporary array, no per-row calls). A filtered pack is decoded chunk by
chunk with the bounded decoder (`ChunkedReader`), which keeps the chunk it decoded last: the
small records sharing a chunk are read one after another.
"""

from __future__ import annotations

import h5py
import numpy as np

from sessions.capture.chunk_read import ChunkedReader
from sessions.capture.pack_layout import ByteRuns, Selection, byte_runs


def _read_runs(pack: h5py.Dataset, chunked: ChunkedReader | None, offset: int, runs: ByteRuns, out: np.ndarray) -> None:
    """The runs' bytes, in order, into `out` (1-D uint8 of `runs.nbytes`)."""
    if runs.nbytes == 0:
        return
    first = offset + runs.start
    if chunked is not None:
        for run in range(runs.count):
            start = first + run * runs.stride
            out[run * runs.length : (run + 1) * runs.length] = chunked.read((slice(start, start + runs.length),))
        return
    space = pack.id.get_space()
    stride = runs.stride if runs.count > 1 else runs.length
    space.select_hyperslab((first,), (runs.count,), (stride,), (runs.length,))
    pack.id.read(h5py.h5s.create_simple((runs.nbytes,)), space, out)


def read_packed(
    pack: h5py.Dataset,
    chunked: ChunkedReader | None,
    offset: int,
    shape: tuple[int, ...],
    storage: np.dtype,
    selection: Selection,
    out: np.ndarray,
) -> np.ndarray:
    """`selection` of the record whose bytes start at `offset` of `pack` (stored shape `shape`,
    element type `storage`) into `out` (C-contiguous, the selection's shape), which is returned."""
    if not out.flags.c_contiguous:
        raise ValueError("a packed record is read into a C-contiguous buffer")
    runs = byte_runs(shape, storage.itemsize, selection)
    if runs.within is None:
        _read_runs(pack, chunked, offset, runs, out.reshape(-1).view(np.uint8))
        return out
    box = np.empty(runs.nbytes, dtype=np.uint8)
    _read_runs(pack, chunked, offset, runs, box)
    out[...] = box.view(storage).reshape(runs.box)[runs.within]
    return out
