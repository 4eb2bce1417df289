"""Index rows as `Record` objects, built only when a caller asks for them.

A capture of a real model holds hundreds of thousands of index rows. The index itself is one
read (a structured array, 0.05 s for 240,000 rows), but a `Record` decodes seven text fields,
and building all of them took 2.9 s for 240,000 rows. Most callers touch a few records (the
viewer's selection, one tensor read) or walk them once, so `Records` builds each batch of rows
the first time any row of it is asked for, and keeps it. Code that looks at every row (checks,
counts) uses the index columns instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import partial
from itertools import chain
from typing import Any, NamedTuple, overload

import numpy as np

from sessions.capture import format as cf
from sessions.capture.columns import IndexColumns


class Record(NamedTuple):
    """One captured tensor, as its index row describes it.

    A named tuple, not a dataclass: a real run has hundreds of thousands of records, and a tuple
    is built, hashed and compared in C (building 240,000 records took 0.8 s as a dataclass)."""

    seq: int
    step: int
    segment: str
    layer: int
    name: str
    occurrence: int
    dtype: str
    shape: tuple[int, ...]
    path: str
    kernel_id: str
    contract_id: str
    effective_contract_id: str
    t_start_ns: int
    t_end_ns: int
    position: int = -1
    """Absolute token position of the first row (canonical rows axis); -1 when not recorded."""
    offset: int = -1
    """Where the tensor's bytes start in the pack `path` names; -1 when `path` names a dataset holding the tensor alone."""
    nbytes: int = -1
    """How many bytes the tensor takes in its pack; -1 for a dataset of its own."""

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def packed(self) -> bool:
        """Whether the tensor's bytes are a range of a pack (docs/capture-format.md, "Packs")."""
        return self.offset != -1 or self.nbytes != -1


def _text_column(column: np.ndarray) -> list[str]:
    """A fixed-length text column decoded once per distinct value: names, segments and dtypes repeat."""
    raws = column.tolist()
    texts = {raw: cf.decode_field(raw) for raw in set(raws)}
    return [texts[raw] for raw in raws]


def records_from_index(index: np.ndarray) -> list[Record]:
    """Records of index rows, built column by column."""
    columns = {name: _text_column(index[name]) for name in cf.INDEX_STRING_FIELDS}
    columns.update({name: index[name].tolist() for name in cf.INDEX_INT_FIELDS})
    ndims = index["ndim"].tolist()
    columns["shape"] = [tuple(dims[:ndim]) for dims, ndim in zip(index["shape"].tolist(), ndims)]
    # tuple.__new__ is what Record._make calls, without a Python frame per record.
    return list(map(partial(tuple.__new__, Record), zip(*(columns[name] for name in Record._fields))))


def records_from_columns(columns: IndexColumns) -> list[Record]:
    """Records of every row at once, from the columns' codes: a text field is decoded and a
    shape built once per distinct value, then taken for every row (both sides of a 240,000-record
    pair: 0.51 s of CPU, against 0.75 s batch by batch from the rows)."""
    fields: dict[str, list[Any]] = {name: columns.texts(name).taken() for name in cf.INDEX_STRING_FIELDS}
    for name in cf.INDEX_INT_FIELDS:
        fields[name] = columns[name].tolist()
    fields["shape"] = columns.shapes().taken()
    return list(map(partial(tuple.__new__, Record), zip(*(fields[name] for name in Record._fields))))


def record_from_row(row: np.void) -> Record:
    return records_from_index(np.asarray(row).reshape(1))[0]


class Records(Sequence[Record]):
    """The records of an index table: each batch of rows built the first time one of them is asked for, then kept."""

    BATCH_ROWS = 256
    """Building a batch holds the interpreter lock: a window asking for one record must not wait
    for many. 1,024 rows took 6 ms, twice per selection (each side's record); 256 take 1.6 ms and
    make a whole 240,000-record walk 13% slower (1.72 against 1.52 s)."""

    def __init__(self, index: np.ndarray, columns: IndexColumns) -> None:
        self._index = index
        self._columns = columns
        self._batches: dict[int, list[Record]] = {}

    @property
    def columns(self) -> IndexColumns:
        """The index these records are rows of, as columns (for work over every row at once)."""
        return self._columns

    def _batch(self, number: int) -> list[Record]:
        batch = self._batches.get(number)
        if batch is None:
            start = number * self.BATCH_ROWS
            batch = self._batches[number] = records_from_index(self._index[start : start + self.BATCH_ROWS])
        return batch

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, item: int) -> Record: ...

    @overload
    def __getitem__(self, item: slice) -> list[Record]: ...

    def __getitem__(self, item: int | slice) -> Record | list[Record]:
        if isinstance(item, slice):
            return [self[i] for i in range(*item.indices(len(self)))]
        at = int(item) + len(self) if int(item) < 0 else int(item)
        if not 0 <= at < len(self):
            raise IndexError(f"record {item} of {len(self)}")
        return self._batch(at // self.BATCH_ROWS)[at % self.BATCH_ROWS]

    @property
    def _batch_count(self) -> int:
        return (len(self) + self.BATCH_ROWS - 1) // self.BATCH_ROWS

    def build_every(self) -> None:
        """Build every record not built yet, all at once (`records_from_columns`): for callers
        about to look up most records by seq. Batch by batch, a rerun session's lookup of
        220,000 pairs' records took 10 s; at once, 0.3 s."""
        count = self._batch_count
        if len(self._batches) < count:
            every = records_from_columns(self._columns)
            size = self.BATCH_ROWS
            self._batches = {number: self._batches.get(number) or every[number * size : (number + 1) * size] for number in range(count)}

    def __iter__(self) -> Iterator[Record]:
        """A walk of every record builds those not built yet all at once (`build_every`)."""
        self.build_every()
        return chain.from_iterable(map(self._batches.__getitem__, range(self._batch_count)))
