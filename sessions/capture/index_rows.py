"""Row-level checks of an index table: everything about a row that needs no other object,
in one vectorised pass over the columns (a real run's index has hundreds of thousands of rows).

A row's dataset, pack and attributes are checked elsewhere (`sessions.capture.record_scan`);
what is found here marks the rows no reader may use (`Capture.bad_rows`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sessions.bits.dtypes import LOGICAL_DTYPES
from sessions.capture import format as cf
from sessions.capture.columns import IndexColumns
from sessions.capture.hdf5_safety import Problem
from sessions.capture.pack_layout import (
    MAX_ELEMENTS,
    expected_nbytes,
    overlapping,
    stored_nbytes,
)
from sessions.capture.text_fields import (
    control_character,
    identifier_problems,
    is_non_canonical_path,
)
from sessions.printable import printable

LISTED_ROWS = 20
"""Rows named one by one per kind of problem; the rest are counted, so a file with a million
bad rows gets a report a person can read."""


def listed(bad: np.ndarray, describe: Callable[[int], Problem], summary: str, table: str = cf.INDEX_PATH) -> list[Problem]:
    """The problems of the rows `bad` marks: the first LISTED_ROWS described, the rest counted."""
    rows = np.flatnonzero(bad)
    found = [describe(int(row)) for row in rows[:LISTED_ROWS]]
    if len(rows) > LISTED_ROWS:
        found.append(Problem(table, f"{len(rows) - LISTED_ROWS} more rows where {summary}"))
    return found


PACKED_BOTH = "offset and nbytes are both -1 (the path names a dataset of its own) or both a byte range of a pack"


def index_problems(columns: IndexColumns) -> tuple[list[Problem], np.ndarray]:
    """Row-level problems of an index table that need no other object, in one vectorised pass
    (the byte ranges of packed rows included: their counts, and no two sharing a byte).

    Returns the problems (at most LISTED_ROWS named per kind) and a mask of the rows that have any.
    """
    index = columns.index
    seqs, ndims, offsets, nbytes = (columns[name] for name in ("seq", "ndim", "offset", "nbytes"))
    dims = columns.dims
    dtypes, dtype_codes = columns.codes("dtype")
    known = np.array([cf.decode_field(raw) in LOGICAL_DTYPES for raw in dtypes.tolist()], dtype=bool)[dtype_codes]
    negative = np.logical_or.reduce([extent < 0 for extent in dims])
    bad_ndim = (ndims < 0) | (ndims > cf.MAX_NDIM)
    trailing = ~bad_ndim & np.logical_or.reduce([(axis >= ndims) & (extent != 0) for axis, extent in enumerate(dims)])
    oversized = ~bad_ndim & ~negative & (_nonzero_elements(ndims, dims) > MAX_ELEMENTS)
    paths, path_codes = columns.codes("path")
    packed = columns.packed
    ranged = packed & (offsets >= 0) & (nbytes >= 0)
    counted = np.full(len(index), -1, dtype=np.int64)
    partner = np.full(len(index), -1, dtype=np.int64)
    clash = np.zeros(len(index), dtype=bool)
    if ranged.any():
        counted = expected_nbytes(dtypes, dtype_codes, ndims, dims)
        partner = overlapping(offsets, nbytes, ranged, path_codes)
        is_pack = np.zeros(int(path_codes.max()) + 1, dtype=bool)
        is_pack[path_codes[ranged]] = True
        clash = ~packed & is_pack[path_codes]

    def text(row: int, field: str) -> str:
        return cf.decode_field(index[field][row])

    def shape(row: int) -> tuple[int, ...]:
        return tuple(int(d) for d in index["shape"][row][: int(index["ndim"][row])])

    def range_of(row: int) -> str:
        return f"[{int(offsets[row])}, {int(offsets[row]) + int(nbytes[row])})"

    def count_detail(row: int) -> str:
        try:
            return f" ({int(nbytes[row])}; a {text(row, 'dtype')} tensor of shape {shape(row)} takes {stored_nbytes(text(row, 'dtype'), shape(row))})"
        except ValueError as exc:
            return f" ({exc})"

    checks: tuple[tuple[np.ndarray, str, Callable[[int], str] | None], ...] = (
        (seqs != np.arange(len(index)), "seq is not the row's position (rows are in execution order)", None),
        (bad_ndim, f"ndim is outside 0..{cf.MAX_NDIM}", None),
        (negative, "shape has a negative dimension", None),
        (
            trailing,
            "shape has entries past ndim that are not 0",
            lambda row: f" (ndim {int(ndims[row])}, shape {[int(d) for d in index['shape'][row]]})",
        ),
        (
            oversized,
            f"shape's non-zero dimensions hold more than 2**{MAX_ELEMENTS.bit_length() - 1} elements",
            lambda row: f" ({shape(row)})",
        ),
        (~known, "logical dtype is not one the format knows", lambda row: f" ({text(row, 'dtype')!r})"),
        *_control_character_checks(columns),
        (index["path"] == b"", "tensor path is empty", None),
        (
            is_non_canonical_path(paths)[path_codes],
            "tensor path is not canonical (absolute, with no empty, '.' or '..' part)",
            lambda row: f" ({text(row, 'path')!r})",
        ),
        (columns["step"] < 0, "step is negative", None),
        (_steps_back(columns["step"]), "step goes back, though rows are in execution order", lambda row: f" (step {int(columns['step'][row])} after step {int(columns['step'][row - 1])})"),
        (columns["layer"] < -1, "layer is below -1", None),
        (columns["occurrence"] < 0, "occurrence is negative", None),
        (columns["position"] < -1, "position is below -1 (-1: not recorded)", None),
        ((offsets < -1) | (nbytes < -1), "offset or nbytes is below -1", None),
        (packed & ~ranged & (offsets >= -1) & (nbytes >= -1), PACKED_BOTH, None),
        (ranged & known & ~bad_ndim & ~negative & (nbytes != counted), "nbytes is not the byte count of its dtype and shape", count_detail),
        (
            partner >= 0,
            "its bytes overlap another row's in the same pack",
            lambda row: f" ({range_of(row)} and /index row {int(partner[row])}'s {range_of(int(partner[row]))} in {text(row, 'path')})",
        ),
        (clash, "its dataset is also a pack of other rows' bytes", None),
    )
    found: list[Problem] = []
    bad_rows = np.zeros(len(index), dtype=bool)
    for bad, what, detail in checks:
        bad_rows |= bad

        def describe(row: int, what: str = what, detail: Callable[[int], str] | None = detail) -> Problem:
            return Problem(f"/index row {row} ({text(row, 'name')})", what + (detail(row) if detail else ""))

        found += listed(bad, describe, what)
    return found, bad_rows


def _steps_back(steps: np.ndarray) -> np.ndarray:
    """Rows whose step is below the row before's: with steps out of order, by-position pairing
    put one step's records under another's number, and a divergence at the wrong step."""
    back = np.zeros(len(steps), dtype=bool)
    back[1:] = steps[1:] < steps[:-1]
    return back


def _nonzero_elements(ndims: np.ndarray, dims: list[np.ndarray]) -> np.ndarray:
    """Each row's product of its shape's non-zero dimensions, approximately (float64: an int64
    product overflows): a zero-element shape still makes a reader allocate and loop by the others."""
    product = np.ones(len(ndims), dtype=np.float64)
    for axis, extent in enumerate(dims):
        product *= np.where((axis < ndims) & (extent > 0), extent, 1)
    return product


def _control_character_checks(columns: IndexColumns) -> list[tuple[np.ndarray, str, Callable[[int], str]]]:
    """Two row checks per text field (`text_checks`). Found once per distinct value of each
    field, so the cost follows the distinct names, not the rows."""
    return [check for field in cf.INDEX_STRING_FIELDS for check in text_checks(*columns.codes(field), field)]


def text_checks(values: np.ndarray, value_codes: np.ndarray, field: str) -> list[tuple[np.ndarray, str, Callable[[int], str]]]:
    """A text column's two row checks, (rows, what is wrong, the row's value in brackets), from its
    distinct `values` and each row's code: not UTF-8 (two different byte strings would read as
    one text, so two names or paths would seem one), or holding a control character, shown escaped."""

    def detail(row: int) -> str:
        value = cf.decode_field(values[value_codes[row]])
        return f" ({printable(control_character(value) or '')} in '{printable(value)}')"

    def raw(row: int) -> str:
        return f" ({bytes(values[value_codes[row]]).rstrip(bytes(1))!r})"

    not_utf8, control = identifier_problems(values)
    return [(not_utf8[value_codes], f"{field} is not UTF-8 text", raw), (control[value_codes], f"{field} holds a control character", detail)]
