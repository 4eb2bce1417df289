"""Aligned pairs: the `AlignedPair` named tuple, and `AlignedPairs`, a run's pairs kept as
columns of its index (the pairing of runs cut alike, `align._pair_by_key_columns`) that builds a
pair only when one is asked for and answers the comparison's per-pair questions on columns."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import cached_property, partial
from itertools import repeat
from typing import NamedTuple, overload

import numpy as np

from sessions.capture.columns import Coded, shared_codes
from sessions.compare.key import OpKey
from sessions.compare.mapped_record import MappedRecord
from sessions.compare.record_columns import KeyColumns, groups
from sessions.compare.record_mapping import MappedKinds


class AlignedPair(NamedTuple):
    """A named tuple, not a dataclass: one per pair of a run, built and shipped to workers by the hundred thousand."""

    key: OpKey
    native: MappedRecord
    oracle: MappedRecord
    manual_reason: str | None = None
    """Set when the user made this pairing: their reason."""


class AlignedPairs(Sequence[AlignedPair]):
    """Pairs of whole records paired by key (runs cut alike), as columns: each side's mapped
    rows (`MappedKinds`) and the pair's key. An `AlignedPair` is built the first time it is asked
    for, then kept; iterating builds them all. Building 240,000 pairs' records, keys and mapped
    records took about 0.5 s of a report that reads the objects of a few pairs (those whose
    bytes differ): the comparison's per-pair work reads these columns instead."""

    def __init__(self, native: MappedKinds, oracle: MappedKinds, n_at: np.ndarray, o_at: np.ndarray, keys: KeyColumns) -> None:
        self.native, self.oracle = native, oracle
        self.n_at, self.o_at = n_at, o_at
        """Each pair's row among each side's mapped records."""
        self.keys_columns = keys
        self._built: dict[int, AlignedPair] = {}
        self._all: list[AlignedPair] | None = None

    def __len__(self) -> int:
        return len(self.n_at)

    def key_at(self, at: int) -> OpKey:
        """Pair `at`'s key alone (a progress label), its records not built."""
        found = self._built.get(at)
        if found is not None:
            return found.key
        k = self.keys_columns
        return tuple.__new__(OpKey, (int(k.step[at]), k.segment.values[k.segment.codes[at]], int(k.layer[at]), k.op.values[k.op.codes[at]], int(k.occurrence[at]), ()))

    def _build(self, at: int) -> AlignedPair:
        if self._all is not None:
            return self._all[at]
        found = self._built.get(at)
        if found is None:
            key = self.key_at(at)
            found = self._built[at] = tuple.__new__(AlignedPair, (key, self.native.one(int(self.n_at[at]), key), self.oracle.one(int(self.o_at[at]), key), None))
        return found

    @overload
    def __getitem__(self, item: int) -> AlignedPair: ...

    @overload
    def __getitem__(self, item: slice) -> AlignedPairs: ...

    def __getitem__(self, item: int | slice) -> AlignedPair | AlignedPairs:
        """A pair, or a slice as pairs of its own (a worker's shard), sharing these columns."""
        if isinstance(item, slice):
            rows = np.arange(len(self))[item]
            return AlignedPairs(self.native, self.oracle, self.n_at[rows], self.o_at[rows], self.keys_columns.rows(rows))
        at = int(item) + len(self) if int(item) < 0 else int(item)
        if not 0 <= at < len(self):
            raise IndexError(f"pair {item} of {len(self)}")
        return self._build(at)

    def __iter__(self) -> Iterator[AlignedPair]:
        """Every pair, built all at once the first time (one by one, a record batch at a time, a
        walk of every pair cost more than the eager alignment did)."""
        return iter(self._every())

    def _every(self) -> list[AlignedPair]:
        if self._all is None:
            k = self.keys_columns
            keys = list(map(partial(tuple.__new__, OpKey), zip(k.step.tolist(), k.segment.taken(), k.layer.tolist(), k.op.taken(), k.occurrence.tolist(), repeat(()))))
            sides = []
            for side, at in ((self.native, self.n_at), (self.oracle, self.o_at)):
                every = side.records if isinstance(side.records, list) else list(side.records)
                records = list(map(every.__getitem__, side.rows[at].tolist()))
                kinds = side.kind_of[at]
                layouts = Coded([m.layout for m in side.mappings], kinds).taken()
                shapes = Coded([m.shape for m in side.mappings], kinds).taken()
                sides.append(list(map(partial(tuple.__new__, MappedRecord), zip(records, keys, layouts, shapes, repeat(None), repeat(side.batch)))))
            built = list(map(partial(tuple.__new__, AlignedPair), zip(keys, sides[0], sides[1], repeat(None))))
            for at, pair in self._built.items():
                built[at] = pair  # a pair asked for before keeps its identity
            self._all = built
        return self._all

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, AlignedPairs)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"AlignedPairs({list(self)!r})"

    # Columns for the comparison's per-pair work.

    @cached_property
    def seqs(self) -> tuple[np.ndarray, np.ndarray]:
        """Each pair's native and oracle record seq (`pair_reader.record_seqs`)."""
        return tuple(side.records.columns["seq"][side.rows[at]].astype(np.int64) for side, at in ((self.native, self.n_at), (self.oracle, self.o_at)))  # type: ignore[return-value]

    def index_rows(self) -> tuple[np.ndarray, np.ndarray]:
        return self.native.rows[self.n_at], self.oracle.rows[self.o_at]

    @cached_property
    def kind_codes(self) -> np.ndarray:
        """Each pair's (native kind, oracle kind), as one code: what a pair's layouts, canonical shapes and compared bytes depend on, with its dtypes and stored shapes."""
        n_rows, o_rows = self.index_rows()
        n_cols, o_cols = self.native.records.columns, self.oracle.records.columns
        dtypes = shared_codes(n_cols.texts("dtype"), o_cols.texts("dtype"))
        shapes = shared_codes(n_cols.shapes(), o_cols.shapes())
        n_class, o_class = _compare_classes(self.native), _compare_classes(self.oracle)
        return groups(n_class[self.native.kind_of[self.n_at]], o_class[self.oracle.kind_of[self.o_at]], dtypes[0][n_rows], dtypes[1][o_rows], shapes[0][n_rows], shapes[1][o_rows]).of_row if len(self) else np.zeros(0, dtype=np.int64)

    def first_of_kinds(self) -> tuple[np.ndarray, np.ndarray]:
        """(a pair of each kind code, each pair's kind code)."""
        codes = self.kind_codes
        first = np.full(int(codes.max()) + 1 if len(codes) else 0, -1, dtype=np.int64)
        first[codes[::-1]] = np.arange(len(codes))[::-1]
        return first, codes

    def per_kind(self, work: Callable[[AlignedPair], object], dtype: object = object) -> np.ndarray:
        """`work` of each pair, asked of one pair per kind code (the answer must depend on the kind alone)."""
        if not len(self):
            return np.zeros(0, dtype=dtype)  # type: ignore[call-overload]
        first, codes = self.first_of_kinds()
        return np.array([work(self[int(at)]) for at in first.tolist()], dtype=dtype)[codes]  # type: ignore[call-overload]

    def op_rows(self, ops: frozenset[str] | set[str]) -> np.ndarray:
        """Rows of pairs whose op is one of `ops`."""
        op = self.keys_columns.op
        hit = np.array([value in ops for value in op.values] or [False], dtype=bool)
        return np.flatnonzero(hit[op.codes]) if len(op.codes) else np.zeros(0, dtype=np.int64)

    def index_of_key(self, key: OpKey) -> int | None:
        """The first pair of `key`, found on the columns."""
        k = self.keys_columns
        if key.positions or key.segment not in k.segment.values or key.op not in k.op.values:
            return None
        hit = (k.step == key.step) & (k.layer == key.layer) & (k.occurrence == key.occurrence)
        hit &= np.isin(k.segment.codes, [i for i, v in enumerate(k.segment.values) if v == key.segment])
        hit &= np.isin(k.op.codes, [i for i, v in enumerate(k.op.values) if v == key.op])
        rows = np.flatnonzero(hit)
        return int(rows[0]) if len(rows) else None


def _compare_classes(side: MappedKinds) -> np.ndarray:
    """Each kind's class as far as a pair's compared bytes and settling by stored bytes go (logits
    or not, layout, canonical shape): kinds differ by layer and name, classes seldom."""
    classes: dict[tuple[bool, str | None, tuple[int, ...]], int] = {}
    return np.array(
        [classes.setdefault((m.op == "logits", m.layout.spec if m.layout is not None else None, m.shape), len(classes)) for m in side.mappings] or [0],
        dtype=np.int64,
    )
