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

from sessions.capture.columns import Coded, IndexColumns, shared_codes
from sessions.capture.reader import Capture
from sessions.compare.byte_checks import KnownStretches
from sessions.machine import available_memory

ALIKE_NUMBERS = ("step", "layer", "occurrence", "ndim", "nbytes")
ALIKE_TEXTS = ("segment", "name", "dtype")
"""With `shape`, the index fields two rows must share to be the same record of runs laid out alike."""
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
    n, o = native.columns, oracle.columns
    alike = (native.packed_addresses[:rows] >= 0) & (oracle.packed_addresses[:rows] >= 0)
    for field in ALIKE_NUMBERS:
        alike &= n[field][:rows] == o[field][:rows]
    for n_axis, o_axis in zip(n.dims, o.dims):
        alike &= n_axis[:rows] == o_axis[:rows]
    for field in ALIKE_TEXTS:
        alike &= _same_text(n, o, field, rows)
    if max_steps is not None:
        alike &= n["step"][:rows] < max_steps
    return alike


def _same_text(native: IndexColumns, oracle: IndexColumns, field: str, rows: int) -> np.ndarray:
    """Whether each of the first `rows` rows holds the same text in `field` on both sides, by
    their codes (a text column has a few distinct values; comparing 64-byte strings row by row
    cost 30 ms per 240,000 rows)."""
    (n_values, n_codes), (o_values, o_codes) = native.codes(field), oracle.codes(field)
    n_shared, o_shared = shared_codes(Coded(n_values.tolist(), n_codes[:rows]), Coded(o_values.tolist(), o_codes[:rows]))
    return n_shared == o_shared  # type: ignore[no-any-return]


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
