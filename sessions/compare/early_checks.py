"""Which stored bytes to check before the records are paired: those both captures lay out alike.

Pairing a real run's hundreds of thousands of records is Python work on one core, and no byte
can be checked before it ends, so on a 2-core machine the second core idled for the 2-3 s it
took. Two captures of the same engine and model (a build against its baseline, a gate's cases)
hold the same records in the same order: index row i of one is row i of the other, in packs of
the same layout. Such rows are found on the index arrays alone, and the bytes they cover are
checked (sessions.compare.byte_checks.KnownStretches) while the pairing runs. Nothing here
decides what is compared: an answer is a fact about two stretches of bytes, used only for the
checks the comparison asks for later, whatever pairs it makes. Captures of different engines
share no such rows, and nothing is read early.
"""

from __future__ import annotations

import numpy as np

from sessions.capture import format as cf
from sessions.capture.reader import Capture
from sessions.compare.byte_checks import KnownStretches
from sessions.machine import available_memory

ALIKE_FIELDS = ("step", "segment", "layer", "name", "occurrence", "dtype", "ndim", "shape", "nbytes")
"""The index fields two rows must share to be the same record of runs laid out alike."""
EARLY_MIN_REGION_BYTES = 1024 * 1024
"""Regions shorter than this a side are left to the comparison: alike rows that seldom follow one
another made 600,000 regions of 1 KiB, whose list alone held the pairing up for 2 s."""
EARLY_SHARE_OF_MEMORY = 4
"""At most this share of the memory the system could give (`available_memory`, page cache
included), a side, is checked early, so both sides take at most half of it: a pair larger than
the page cache would otherwise push out what the comparison reads first. An eighth of the
machine's memory a side left a quarter of an 8.1 GB pair of 240,000 records (24 GB, 2 cores)
to check after the pairing: `report --workers 2` took 3.20-3.72 s (mean 3.43 s) against
3.01-3.47 s (mean 3.14 s) with all of it checked early (alternating runs)."""


def alike_rows(native: Capture, oracle: Capture, max_steps: int | None) -> np.ndarray:
    """For each of the first rows both indexes have, whether the two rows describe the same
    record stored as one contiguous stretch of a pack on each side (within the step budget)."""
    rows = min(len(native.index), len(oracle.index))
    alike = (native.packed_addresses[:rows] >= 0) & (oracle.packed_addresses[:rows] >= 0)
    n_words, o_words = _row_words(native.index[:rows]), _row_words(oracle.index[:rows])
    for start, end in _field_words(ALIKE_FIELDS):
        alike &= (n_words[:, start:end] == o_words[:, start:end]).all(axis=1)
    if max_steps is not None:
        alike &= native.columns["step"][:rows] < max_steps
    return alike


def _row_words(index: np.ndarray) -> np.ndarray:
    """Index rows as their 8-byte words, one row of words per row, in place."""
    return np.ascontiguousarray(index).view(np.uint64).reshape(len(index), cf.INDEX_DTYPE.itemsize // 8)


def _field_words(fields: tuple[str, ...]) -> list[tuple[int, int]]:
    """The runs of an index row's 8-byte words that hold any byte of `fields`.

    Rows are compared by the raw bytes of these words, not field by field: a 240,000-row pair
    took 23 ms so, against 180 ms for its text fields' codes and its shape's axes, which held the
    early check up that long. A word may also hold bytes of a field not asked for, and a text may
    differ in bytes past its end: such rows are then not alike here, and their bytes are left to
    the comparison, which reads whatever was not checked early."""
    held = np.zeros(cf.INDEX_DTYPE.itemsize // 8, dtype=bool)
    for field in fields:
        offset, size = cf.INDEX_DTYPE.fields[field][1], cf.INDEX_DTYPE[field].itemsize
        held[offset // 8 : -(-(offset + size) // 8)] = True
    edges = np.flatnonzero(np.diff(np.concatenate(([0], held.view(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def early_stretches(native: Capture, oracle: Capture, max_steps: int | None, limit: int | None = None) -> KnownStretches:
    """The regions of alike rows whose bytes follow one another on both sides, in index order,
    of EARLY_MIN_REGION_BYTES or more, up to `limit` bytes a side (default: EARLY_SHARE_OF_MEMORY
    of the memory the system could give)."""
    n_fd, o_fd = native.descriptor, oracle.descriptor
    if n_fd is None or o_fd is None:
        return KnownStretches(-1, -1, [])
    alike = alike_rows(native, oracle, max_steps)
    rows = len(alike)
    n_at, o_at = native.packed_addresses[:rows], oracle.packed_addresses[:rows]
    size = native.columns["nbytes"][:rows]
    follows = np.zeros(rows, dtype=bool)
    follows[1:] = alike[1:] & alike[:-1] & (n_at[1:] == n_at[:-1] + size[:-1]) & (o_at[1:] == o_at[:-1] + size[:-1])
    first = np.flatnonzero(alike & ~follows)
    lengths = np.add.reduceat(np.where(alike, size, 0), first) if len(first) else np.zeros(0, dtype=np.int64)
    budget = available_memory() // EARLY_SHARE_OF_MEMORY if limit is None else limit
    regions: list[tuple[int, int, int]] = []
    for start, length in zip(first.tolist(), lengths.tolist()):
        if budget <= 0:
            break
        if length < EARLY_MIN_REGION_BYTES:
            continue
        length = min(length, budget)
        regions.append((int(n_at[start]), int(o_at[start]), length))
        budget -= length
    regions.sort()
    return KnownStretches(n_fd, o_fd, _disjoint(regions))


def _disjoint(regions: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Regions sorted by native offset, without those that overlap one before them (rows of a
    damaged or hand-made capture may claim the same bytes): a check is answered by one region."""
    kept: list[tuple[int, int, int]] = []
    end = -1
    for region in regions:
        if region[0] >= end:
            kept.append(region)
            end = region[0] + region[2]
    return kept
