"""A record's recorder attribute (`ggml_src`), wherever the writer put it.

A tensor in a dataset of its own carries it as `NAME`. A packed tensor's is an element of its
pack's attribute table `NAME[]`, one element per record the pack holds, in seq order; files
written before tables carry it as an attribute of its own on the pack, `NAME[SEQ]`
(docs/capture-format.md, "Recorder attributes"). A table keeps the cost per pack, not per
record: an attribute per record cost libhdf5 about 30 us to write and made the structure
check of a 50,000-record capture take 3.9 s instead of 0.19 s (libhdf5 finds each of a
dataset's attributes by walking the others).
"""

from __future__ import annotations

import h5py
import numpy as np

from sessions.capture import format as cf
from sessions.capture.hdf5_safety import Problem, UnsafeObject, read_attribute
from sessions.capture.reader import Capture, Record

KEPT_TABLES = 8
"""Tables kept read at once (each at most 60,000 bytes)."""


class PackedAttributes:
    """Attribute `name` of records, read through `read_attribute` (type and size checked first),
    a pack's table once for all the records asked about in it."""

    def __init__(self, capture: Capture, name: str, budget: int | None = None) -> None:
        self.capture = capture
        self.name = name
        self.budget = capture.memory_budget if budget is None else budget
        self._tables: dict[str, np.ndarray | None | UnsafeObject] = {}
        """The tables of the packs asked about lately (a pack of its own comes between a step's
        buffered records), or why a table could not be read: each is read once."""

    def value(self, obj_id: h5py.h5o.ObjectID, record: Record) -> np.ndarray | None:
        """The record's value as a scalar array (`obj_id`: its dataset or pack); None when it has
        none. UnsafeObject when the file holds one that cannot be read, or a table that does not
        fit its pack's records."""
        if not record.packed:
            return read_attribute(obj_id, record.path, self.name, self.budget)
        element = self.element(obj_id, record)
        if element is None:
            return read_attribute(obj_id, record.path, cf.packed_attribute(self.name, record.seq), self.budget)
        value = self._table(obj_id, record.path)[element]
        return np.array(value) if bytes(value).rstrip(b"\0") else None

    def element(self, obj_id: h5py.h5o.ObjectID, record: Record) -> int | None:
        """Which element of its pack's table is the packed record's; None when the pack has no
        table. UnsafeObject when the table cannot be read or does not fit the pack's records."""
        table = self._table(obj_id, record.path)
        if table is None:
            return None
        where = f"{record.path} attribute '{cf.attribute_table(self.name)}'"
        if table.dtype.kind != "S":
            raise UnsafeObject(Problem(where, f"holds {table.dtype} values; a table holds fixed-length UTF-8 strings"))
        members = self.capture.pack_members(record.path)
        if table.ndim != 1 or len(table) != len(members):
            held = f"{len(table)} elements" if table.ndim == 1 else f"a {table.ndim}-D array"
            raise UnsafeObject(Problem(where, f"holds {held}; the pack holds {len(members)} records, one element each"))
        element = int(np.searchsorted(members, record.seq))
        assert members[element] == record.seq, "a packed record is one of its pack's members (seq is the row's position)"
        return element

    def _table(self, obj_id: h5py.h5o.ObjectID, path: str) -> np.ndarray | None:
        """The pack's table, None when it has none; raises again why it could not be read."""
        if path not in self._tables:
            if len(self._tables) >= KEPT_TABLES:
                self._tables.clear()
            try:
                self._tables[path] = read_attribute(obj_id, path, cf.attribute_table(self.name), self.budget)
            except UnsafeObject as exc:
                self._tables[path] = exc
        table = self._tables[path]
        if isinstance(table, UnsafeObject):
            raise table
        return table
