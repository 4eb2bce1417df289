"""A record as one aligned pair compares it: its batch row, its token positions, its canonical layout.

Runs cut differently (docs/profiles.md, "Alignment modes") compare part of a record: the
rows of a combined prefill that a segmented run computed in one of its calls, or the row of a
batch that holds the request. Every reader of a pair's bits (the comparison's chunked reads,
the viewer, reruns) asks the record for its stored selection here, so all of them read the
same elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from sessions.capture.reader import Capture, Record
from sessions.compare.key import OpKey
from sessions.compare.layout_transform import LayoutTransform
from sessions.compare.profiles import rows_axis


@dataclass(frozen=True)
class BatchRow:
    """Where a batched run's records keep the request under comparison (docs/capture-format.md,
    root attributes `batch_size`, `batch_row`, `batch_stacked`)."""

    size: int
    row: int
    stacked: bool = False
    """Axis 0 was added to stack the requests: the request's record is row `row` without axis 0.
    Otherwise axis 0 is the engine's own batch axis, which the request alone has too (size 1)."""

    def text(self) -> str:
        return f"row {self.row} of a batch of {self.size}"

    def request_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one request's record in a record of the batch."""
        return shape[1:] if self.stacked else (1, *shape[1:])


class MappedRecord(NamedTuple):
    """A named tuple, not a dataclass: alignment builds one per record of a run (hundreds of thousands)."""

    record: Record
    key: OpKey
    layout: LayoutTransform | None
    shape: tuple[int, ...]
    """The canonical shape of what is compared: after the batch row, the window and the layout transform."""
    window: tuple[int, int] | None = None
    """Canonical rows [start, stop) of this record on its op's rows axis that the pair compares; None: all."""
    batch: BatchRow | None = None
    """The request compared, in a record of a batched run (its stored axis-0 row); None: not batched."""

    def stored_shape(self) -> tuple[int, ...]:
        """The record's stored shape as the layout sees it: a batched record's request alone."""
        shape = self.record.shape
        return shape if self.batch is None else self.batch.request_shape(shape)

    def _stored_axis(self, canonical_axis: int) -> int:
        """The stored axis whose index ranges are ranges of canonical axis `canonical_axis`."""
        added = 1 if self.batch is not None and self.batch.stacked else 0
        if self.layout is None:
            return canonical_axis + added
        group = self.layout.outputs[canonical_axis]
        return self.layout.inputs.index(group[0]) + added

    def selection(self, rows: tuple[int, int] | None = None) -> tuple[slice, ...] | None:
        """The stored selection holding what the pair compares, narrowed to its canonical axis-0
        rows [start, stop) when `rows` is given; None when that is the whole record."""
        shape = self.record.shape
        selection = [slice(0, n) for n in shape]
        if self.batch is not None:
            selection[0] = slice(self.batch.row, self.batch.row + 1)
        if self.window is not None:
            axis = self._stored_axis(rows_axis(self.key.op))
            selection[axis] = slice(self.window[0], self.window[1])
        if rows is not None:
            axis = self._stored_axis(0)
            per_unit = self.layout.rows_per_unit(self.stored_shape()) if self.layout is not None else 1
            base = selection[axis].start
            selection[axis] = slice(base + rows[0] // per_unit, base + rows[1] // per_unit)
        if all(s == slice(0, n) for s, n in zip(selection, shape)):
            return None
        return tuple(selection)

    def call_rows(self) -> int:
        """Rows the forward call that wrote this record computed, whole (not the window a pair
        compares) and over every request of a batch: the batch shape the engine's kernels saw."""
        rows = self.record.shape[self._stored_axis(rows_axis(self.key.op))]
        return rows * (self.batch.size if self.batch is not None else 1)

    def canonical(self, bits: np.ndarray) -> np.ndarray:
        """Stored bits of `selection()` (or a narrowing of it) brought to the canonical layout."""
        if self.batch is not None and self.batch.stacked:
            bits = bits.reshape(bits.shape[1:])
        return self.layout.apply(bits) if self.layout is not None else bits

    def whole(self, key: OpKey) -> MappedRecord:
        """This record whole (no window), paired under `key`."""
        return tuple.__new__(MappedRecord, (self.record, key, self.layout, self.shape, None, self.batch))

    def cut(self, window: tuple[int, int], key: OpKey) -> MappedRecord:
        """This record narrowed to canonical rows `window` of its rows axis, paired under `key`.
        Built with `tuple.__new__`: runs cut differently cut every record they pair
        (`_replace` took 1.2 s for a 240,000-record pair)."""
        axis = rows_axis(self.key.op)
        if window == (0, self.shape[axis]):
            return self.whole(key)
        shape = list(self.shape)
        shape[axis] = window[1] - window[0]
        return tuple.__new__(MappedRecord, (self.record, key, self.layout, tuple(shape), window, self.batch))


def batch_of(capture: Capture) -> BatchRow | None:
    """Where a batched run's capture keeps its request; None for one request."""
    meta = capture.meta
    return BatchRow(meta.batch_size, meta.batch_row, meta.batch_stacked) if meta.batch_size > 1 or meta.batch_stacked else None


def canonical_shape(stored: tuple[int, ...], layout: LayoutTransform | None, batch: BatchRow | None) -> tuple[int, ...]:
    """The canonical shape (before any window) of a record stored as `stored`; LayoutError when the layout does not fit."""
    shape = stored if batch is None else batch.request_shape(stored)
    return layout.output_shape(shape) if layout is not None else shape


def cut_problem(mapped: MappedRecord) -> str | None:
    """Why this record cannot be cut by token position, or None when it can."""
    if mapped.layout is None:
        return None
    group = mapped.layout.outputs[rows_axis(mapped.key.op)]
    if len(group) == 1:
        return None
    return f"its layout {mapped.layout.spec!r} merges {' and '.join(group)} into the token rows, so one position's elements are not one slice"
