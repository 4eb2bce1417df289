"""Index columns as contiguous arrays and small integer codes, for checks over a million rows.

A row of the index is 480 bytes, so each column is a strided view of it, and numpy is slow on
strided views of sub-arrays and byte strings: a reduction across the 8 entries of `shape`, or a
comparison of 64-byte paths, costs 10 to 20 ms per 240,000 rows, where the same work on a
contiguous copy of one integer column costs a fraction of a millisecond. Checks therefore
copy the columns they need once, and compare text fields as 8-byte words. An index repeats
itself in runs (a pack's rows follow one another, as do a step's dtypes), so distinct values
are found among the runs' first rows, by hashing when there are many.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from sessions.capture import format as cf

SORTED_RUNS = 4096
"""Up to this many runs, a text column's distinct values are found by sorting them; past it by hashing."""

_FNV_PRIME = np.uint64(0x100000001B3)


Value = TypeVar("Value", bound=Hashable)


@dataclass(frozen=True)
class Coded(Generic[Value]):
    """A column of repeating values as its distinct values and each row's position among them:
    equal values have equal codes, so rows are grouped by their codes instead of their values."""

    values: list[Value]
    codes: np.ndarray

    @classmethod
    def merged(cls, values: list[Value], codes: np.ndarray) -> Coded[Value]:
        """`values` with `codes` into them, made one code where two values are equal: distinct
        raw bytes of a text field can decode to one text (invalid UTF-8 is shown as U+FFFD)."""
        first: dict[Value, int] = {}
        remap = np.array([first.setdefault(value, len(first)) for value in values], dtype=np.int64)
        return cls(list(first), remap[codes] if len(first) < len(values) else codes.astype(np.int64, copy=False))

    @classmethod
    def of(cls, values: Sequence[Value]) -> Coded[Value]:
        """A column given value by value."""
        first: dict[Value, int] = {}
        codes = np.fromiter((first.setdefault(value, len(first)) for value in values), dtype=np.int64, count=len(values))
        return cls(list(first), codes)

    def rows(self, rows: np.ndarray) -> Coded[Value]:
        """The column of rows `rows` (row indices, or a mask), its values shared, not copied."""
        return Coded(self.values, self.codes[rows])

    def taken(self, rows: np.ndarray | None = None) -> list[Value]:
        """The value of each row (of `rows`; all when None), as one list (the values shared, not copied)."""
        table = np.empty(len(self.values), dtype=object)
        for at, value in enumerate(self.values):
            table[at] = value
        return table[self.codes if rows is None else self.codes[rows]].tolist()  # type: ignore[no-any-return]


def shared_codes(a: Coded[Value], b: Coded[Value]) -> tuple[np.ndarray, np.ndarray]:
    """Both columns' codes into one list of values, so that equal codes mean equal values across
    them: each side codes its own values, and a code of one means nothing to the other until both
    are remapped."""
    shared: dict[Value, int] = {}
    remap = [np.array([shared.setdefault(value, len(shared)) for value in column.values], dtype=np.int64) for column in (a, b)]
    return remap[0][a.codes], remap[1][b.codes]


class IndexColumns:
    """An index table's columns, each copied (or coded) once, whatever number of checks use it."""

    def __init__(self, index: np.ndarray) -> None:
        self.index = index
        self._copies: dict[str, np.ndarray] = {}
        self._codes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._dims: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, name: str) -> np.ndarray:
        """One field as a contiguous array."""
        if name not in self._copies:
            self._copies[name] = np.ascontiguousarray(self.index[name])
        return self._copies[name]

    def codes(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """`codes` of a text field."""
        if name not in self._codes:
            self._codes[name] = codes(self.index[name])
        return self._codes[name]

    def shape_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """(for each distinct shape, a row that has it; each row's position among them): `codes`
        of `ndim` and `shape` together, seen as one 72-byte value per row."""
        if "shape" not in self._codes:
            joined = np.ascontiguousarray(np.column_stack([self["ndim"], *self.dims]).astype(np.int64, copy=False))
            _, row_codes = codes(joined.view(np.dtype((np.void, joined.shape[1] * 8))).reshape(-1))
            rows = np.zeros(int(row_codes.max()) + 1 if len(row_codes) else 0, dtype=np.int64)
            rows[row_codes] = np.arange(len(row_codes))
            self._codes["shape"] = rows, row_codes
        return self._codes["shape"]

    def texts(self, name: str) -> Coded[str]:
        """A text field decoded, once per distinct value."""
        values, codes = self.codes(name)
        return Coded.merged([cf.decode_field(value) for value in values.tolist()], codes)

    def shapes(self) -> Coded[tuple[int, ...]]:
        """`shape` as tuples of `ndim` entries, each built once per distinct shape."""
        rows, codes = self.shape_codes()
        shape, ndim = self.index["shape"], self["ndim"]
        return Coded.merged([tuple(shape[row, : ndim[row]].tolist()) for row in rows.tolist()], codes)

    @property
    def dims(self) -> list[np.ndarray]:
        """`shape` as one contiguous column per axis."""
        if self._dims is None:
            shape = self.index["shape"]
            self._dims = [np.ascontiguousarray(shape[:, axis]) for axis in range(shape.shape[1])]
        return self._dims

    @property
    def packed(self) -> np.ndarray:
        """Rows whose `offset` or `nbytes` is set: a byte range of a pack (or a broken attempt at one)."""
        return (self["offset"] != -1) | (self["nbytes"] != -1)


def _words(text: np.ndarray) -> np.ndarray:
    """A fixed-length text column as its 8-byte words (or bytes), one contiguous row per word,
    gathered in one pass (one pass per word costs twice as much), without the words no row sets:
    texts are short in wide fields (a 64-byte name column of 240,000 rows held its names in 2
    words of 8), and a word that is zero in every row tells no two rows apart."""
    size = text.dtype.itemsize
    unit = np.uint64 if size % 8 == 0 else np.uint8
    words = np.ascontiguousarray(text.view(np.dtype((unit, (size // np.dtype(unit).itemsize,)))).T)
    used = words.any(axis=1)
    return words if used.all() else words[used]


def changes(text: np.ndarray) -> np.ndarray:
    """Whether each row of a text column but the first differs from the one before."""
    differ = np.zeros(max(0, len(text) - 1), dtype=bool)
    for word in _words(text):
        differ |= word[1:] != word[:-1]
    return differ


def codes(text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a text column's distinct values, each row's position among them).

    The values are sorted when the column has few runs; otherwise they are in no particular
    order (hashing the runs, then checking every run equals its value, is much faster than
    sorting hundreds of thousands of strings)."""
    if not len(text):
        return text[:0], np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate(([True], changes(text))))
    runs = text[starts]
    values, run_codes = np.unique(runs, return_inverse=True) if len(runs) <= SORTED_RUNS else _hashed(runs)
    return values, np.repeat(run_codes.reshape(-1), np.diff(np.append(starts, len(text))))


def _hashed(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(runs, return_inverse=True)` through a 64-bit FNV-style hash of each value;
    sorted after all when two different values share a hash."""
    words = _words(runs)
    hashes = np.zeros(len(runs), dtype=np.uint64)
    for word in words:
        hashes ^= word.astype(np.uint64, copy=False)
        hashes *= _FNV_PRIME
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    if not np.array_equal(words[:, first][:, inverse], words):
        return np.unique(runs, return_inverse=True)  # type: ignore[no-any-return]
    return runs[first], inverse
