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

from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from sessions.capture.columns import Coded, shared_codes
from sessions.capture.reader import Record
from sessions.capture.records import Records


@dataclass(frozen=True)
class RecordColumns:
    """The fields alignment groups records by, one array (or coded column) per field."""

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

        def column(name: str) -> np.ndarray:
            return columns[name].astype(np.int64, copy=False)

        return RecordColumns(
            seq=column("seq"),
            step=column("step"),
            layer=column("layer"),
            occurrence=column("occurrence"),
            position=column("position"),
            segment=columns.texts("segment"),
            name=columns.texts("name"),
            kernel_id=columns.texts("kernel_id"),
            shape=columns.shapes(),
        )

    def numbers(name: str) -> np.ndarray:
        return np.fromiter(map(itemgetter(Record._fields.index(name)), records), dtype=np.int64, count=len(records))

    def coded(name: str) -> Coded[Any]:
        return Coded.of(list(map(itemgetter(Record._fields.index(name)), records)))

    return RecordColumns(
        seq=numbers("seq"),
        step=numbers("step"),
        layer=numbers("layer"),
        occurrence=numbers("occurrence"),
        position=numbers("position"),
        segment=coded("segment"),
        name=coded("name"),
        kernel_id=coded("kernel_id"),
        shape=coded("shape"),
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


@dataclass(frozen=True)
class KeyColumns:
    """Mapped records' op keys (whole calls, no positions) as columns, row for row with their
    list: pairing two runs of hundreds of thousands of records by key then compares integers.
    Hashing a tuple key per record took 0.26 s of a 240,000-record pair's alignment."""

    step: np.ndarray
    segment: Coded[str]
    layer: np.ndarray
    op: Coded[str]
    occurrence: np.ndarray

    @classmethod
    def none(cls) -> KeyColumns:
        """The keys of a run without mapped records."""
        no_rows = np.zeros(0, dtype=np.int64)
        return cls(no_rows, Coded([], no_rows), no_rows, Coded([], no_rows), no_rows)

    def __len__(self) -> int:
        return len(self.step)

    def rows(self, kept: np.ndarray) -> KeyColumns:
        """The keys of rows `kept` (row indices, in order)."""
        return KeyColumns(self.step[kept], self.segment.rows(kept), self.layer[kept], self.op.rows(kept), self.occurrence[kept])


def shared_keys(a: KeyColumns, b: KeyColumns) -> tuple[np.ndarray, np.ndarray, int]:
    """Each row's key as one integer, equal across `a` and `b` exactly when the keys are, and how many distinct keys there are."""
    segments, ops = shared_codes(a.segment, b.segment), shared_codes(a.op, b.op)
    both = groups(
        np.concatenate((a.step, b.step)),
        np.concatenate(segments),
        np.concatenate((a.layer, b.layer)),
        np.concatenate(ops),
        np.concatenate((a.occurrence, b.occurrence)),
    )
    return both.of_row[: len(a)], both.of_row[len(a) :], len(both.first)
