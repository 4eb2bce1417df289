"""Reading a packed record (or a selection of it) from its pack into the caller's buffer.

The comparison reads canonical row ranges of records into buffers it reuses; for a packed
record such a range is a regular run of pack bytes. When the pack is the reference writer's
kind (contiguous, so its bytes are one run of the file, checked to lie inside it), those bytes
are read with pread straight into that buffer: libhdf5 costs about 40 us per read whatever its
size, which for the small tensors of a decode step is most of a comparison's time. Other packs
(chunked, compact) are read by libhdf5 as one hyperslab; a filtered pack is decoded chunk by
chunk with the bounded decoder (`ChunkedReader`), which keeps the chunk it decoded last: the
small records sharing a chunk are read one after another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import h5py
import numpy as np

from sessions.capture.chunk_read import ChunkedReader
from sessions.capture.pack_layout import ByteRuns, Selection, byte_runs

PREAD_RUNS = 64
"""Up to this many runs per read go through pread; a selection cut into more is one libhdf5 hyperslab."""


@dataclass(frozen=True)
class Pack:
    """A pack that passed its check: its dataset, its size in bytes, and how it is read."""

    dataset: h5py.Dataset
    size: int
    address: int | None
    """Where its bytes start in the file, when they are one contiguous run inside it; else None."""
    filtered: bool
    """Whether its chunks pass through filters (then they are decoded here, bounded)."""


def pread_exact(descriptor: int, address: int, out: np.ndarray) -> None:
    """Exactly `out.size` bytes from `address` of the file; OSError where the file now ends
    sooner (it was cut short after its check)."""
    view = memoryview(out)
    done = 0
    while done < len(view):
        got = os.preadv(descriptor, [view[done:]], address + done)
        if got == 0:
            raise OSError(f"the file ends at byte {address + done}, inside this record's bytes (cut short since it was checked)")
        done += got


def _read_runs(pack: Pack, descriptor: int | None, chunked: ChunkedReader | None, offset: int, runs: ByteRuns, out: np.ndarray) -> None:
    """The runs' bytes, in order, into `out` (1-D uint8 of `runs.nbytes`)."""
    if runs.nbytes == 0:
        return
    first = offset + runs.start
    if chunked is not None:
        for run in range(runs.count):
            start = first + run * runs.stride
            out[run * runs.length : (run + 1) * runs.length] = chunked.read((slice(start, start + runs.length),))
        return
    if pack.address is not None and descriptor is not None and runs.count <= PREAD_RUNS:
        for run in range(runs.count):
            pread_exact(descriptor, pack.address + first + run * runs.stride, out[run * runs.length : (run + 1) * runs.length])
        return
    space = pack.dataset.id.get_space()
    stride = runs.stride if runs.count > 1 else runs.length
    space.select_hyperslab((first,), (runs.count,), (stride,), (runs.length,))
    pack.dataset.id.read(h5py.h5s.create_simple((runs.nbytes,)), space, out)


def read_packed(
    pack: Pack,
    descriptor: int | None,
    chunked: ChunkedReader | None,
    offset: int,
    shape: tuple[int, ...],
    storage: np.dtype,
    selection: Selection,
    out: np.ndarray,
) -> np.ndarray:
    """`selection` of the record whose bytes start at `offset` of `pack` (stored shape `shape`,
    element type `storage`) into `out` (C-contiguous, the selection's shape), which is returned.
    `descriptor` is the file open for reading (`Capture.descriptor`), or None to read through libhdf5."""
    if not out.flags.c_contiguous:
        raise ValueError("a packed record is read into a C-contiguous buffer")
    runs = byte_runs(shape, storage.itemsize, selection)
    if runs.within is None:
        _read_runs(pack, descriptor, chunked, offset, runs, out.reshape(-1).view(np.uint8))
        return out
    box = np.empty(runs.nbytes, dtype=np.uint8)
    _read_runs(pack, descriptor, chunked, offset, runs, box)
    out[...] = box.view(storage).reshape(runs.box)[runs.within]
    return out
