"""A run's records as the columns alignment groups them by: integer arrays and small codes.

Alignment asks of every record which kind it is (name, occurrence, kernel, layer, shape...) and
how many records share its (step, segment, layer, name). A real run has hundreds of thousands
of records and a few thousand kinds: asked record by record in Python, with tuples hashed per
record, that took 0.27 s a side of a 240,000-record pair; asked of these columns with numpy, a
tenth of it. A capture's `Records` already holds its index as columns
(`sessions.capture.columns`), so they are taken from there; any other list of records (a run
cut to its first steps, a test's own records) is turned into columns here.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from sessions.capture import format as cf
from sessions.capture.reader import Record
from sessions.capture.records import Records

Value = TypeVar("Value", bound=Hashable)


@dataclass(frozen=True)
class Coded(Generic[Value]):
    """A column of repeating values as the distinct values and each row's position among them:
    equal values have equal codes, so codes can be grouped in place of the values."""

    values: list[Value]
    codes: np.ndarray

    def taken(self, rows: np.ndarray | None = None) -> list[Value]:
        """The values of `rows` (all rows when None), as one list (the values shared, not copied)."""
        table = np.empty(len(self.values), dtype=object)
        for at, value in enumerate(self.values):
            table[at] = value
        return table[self.codes if rows is None else self.codes[rows]].tolist()  # type: ignore[no-any-return]


def coded(values: list[Value], codes: np.ndarray) -> Coded[Value]:
    """`values` with `codes` into them, merged where two values are equal: distinct raw bytes of a
    text field can decode to one text (invalid UTF-8 is shown as U+FFFD), and must group as one."""
    first: dict[Value, int] = {}
    remap = np.array([first.setdefault(value, len(first)) for value in values], dtype=np.int64)
    return Coded(list(first), remap[codes] if len(first) < len(values) else codes.astype(np.int64, copy=False))


def _listed(values: Sequence[Value]) -> Coded[Value]:
    first: dict[Value, int] = {}
    codes = np.fromiter((first.setdefault(value, len(first)) for value in values), dtype=np.int64, count=len(values))
    return Coded(list(first), codes)


@dataclass(frozen=True)
class RecordColumns:
    """The records, and the fields alignment groups them by, one array (or code column) per field."""

    records: Sequence[Record]
    seq: np.ndarray
    step: np.ndarray
    layer: np.ndarray
    occurrence: np.ndarray
    position: np.ndarray
    segment: Coded[str]
    name: Coded[str]
    kernel_id: Coded[str]
    shape: Coded[tuple[int, ...]]

    def __len__(self) -> int:
        return len(self.seq)


def record_columns(records: Sequence[Record]) -> RecordColumns:
    """`records`' columns: from the index columns of a capture's `Records`, else from the records."""
    if isinstance(records, Records):
        columns = records.columns
        texts = {
            name: coded([cf.decode_field(value) for value in values.tolist()], codes)
            for name in ("segment", "name", "kernel_id")
            for values, codes in [columns.codes(name)]
        }
        rows, shape_codes = columns.shape_codes()
        stored, ndim = columns.index["shape"], columns["ndim"]
        shapes = coded([tuple(stored[row, : ndim[row]].tolist()) for row in rows.tolist()], shape_codes)
        ints = {name: columns[name].astype(np.int64, copy=False) for name in ("seq", "step", "layer", "occurrence", "position")}
        return RecordColumns(records, **ints, **texts, shape=shapes)  # type: ignore[arg-type]
    count = len(records)

    def ints(field: int) -> np.ndarray:
        return np.fromiter(map(itemgetter(field), records), dtype=np.int64, count=count)

    return RecordColumns(
        records,
        seq=ints(0),
        step=ints(1),
        layer=ints(3),
        occurrence=ints(5),
        position=ints(14),
        segment=_listed(list(map(itemgetter(2), records))),
        name=_listed(list(map(itemgetter(4), records))),
        kernel_id=_listed(list(map(itemgetter(9), records))),
        shape=_listed(list(map(itemgetter(7), records))),
    )


class Groups(NamedTuple):
    """Rows grouped by equal combinations of some columns."""

    first: np.ndarray
    """A row of each group (its first)."""
    of_row: np.ndarray
    """Each row's group."""
    sizes: np.ndarray
    """How many rows each group has."""


_COMBINED_LIMIT = 1 << 62


def groups(*columns: np.ndarray) -> Groups:
    """Rows grouped by the combination of `columns` (integers of any range). Columns are folded
    into one int64 per row, each taking the range its values span (or, when that is wider than
    there are rows, the rank of its values): never a product past 2**62."""
    rows = len(columns[0])
    combined = np.zeros(rows, dtype=np.int64)
    width = 1
    for column in columns:
        low, high = (int(column.min()), int(column.max())) if rows else (0, 0)
        span = high - low + 1
        if span > rows:
            distinct, ranks = np.unique(column, return_inverse=True)
            column, span = ranks.reshape(-1), len(distinct)
        else:
            column = column - low
        if width * span >= _COMBINED_LIMIT:
            distinct, combined = np.unique(combined, return_inverse=True)
            combined, width = combined.reshape(-1).astype(np.int64, copy=False), len(distinct)
        combined = combined * span + column
        width *= span
    _, first, of_row, sizes = np.unique(combined, return_index=True, return_inverse=True, return_counts=True)
    return Groups(first, of_row.reshape(-1), sizes)
