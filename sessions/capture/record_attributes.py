"""A record's raw HDF5 attributes and index row, as `silx view` or `h5dump -A` would show them.

An engine's recorder may write anything beside a tensor (`ggml_src`, `logical_shape`, its own
notes), and a user who doubts a pairing wants to see exactly that. The file is untrusted, so
everything goes through the hardened reader: the dataset is reached through checked links
(`LinkWalker`), each attribute's type and size are checked before its value is read
(`read_attribute`), and no value larger than `MAX_SHOWN_BYTES` is read. Whatever cannot be
shown becomes a row that says why; nothing here raises on a bad file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import h5py
import numpy as np

from sessions.capture.format import decode_field
from sessions.capture.hdf5_safety import (
    HDF5_ERRORS,
    UnsafeObject,
    describe_error,
    read_attribute,
)
from sessions.capture.packed_attributes import PackedAttributes
from sessions.capture.reader import Capture, Record
from sessions.printable import printable
from sessions.progress import Progress, ProgressGenerator

MAX_SHOWN_BYTES = 64 * 1024
"""Largest attribute value read for display; a larger one is listed with its size, unread."""
MAX_LISTED = 256
"""Attributes listed per record: a crafted file may declare millions."""
MAX_VALUE_CHARS = 2000
"""A value's text is cut here (a table cell, not a dump)."""
MAX_TYPE_DEPTH = 4
"""Array and enum types nest; a crafted one may nest without end."""


@dataclass(frozen=True)
class AttributeRow:
    name: str
    hdf5_type: str
    shape: str
    value: str
    """The value as text, or why it is not shown (then `problem` is set)."""
    problem: bool = False


@dataclass(frozen=True)
class RecordAttributes:
    """One side's record: its index row, its dataset as stored, and every attribute of that dataset."""

    side: str
    file: str
    path: str
    index_row: tuple[tuple[str, str], ...]
    stored: str
    """The dataset's stored element type and shape (quantized blocks are stored as bytes), or why unknown."""
    attributes: tuple[AttributeRow, ...]


_PACKED_NAME = re.compile(r"\[(\d+)\]$")


def type_text(tid: h5py.h5t.TypeID, depth: int = 0) -> str:
    """An HDF5 datatype in words (class, width, byte order), read from its metadata only."""
    if depth > MAX_TYPE_DEPTH:
        return "nested type"
    cls, size = tid.get_class(), tid.get_size()
    if cls == h5py.h5t.STRING:
        cset = "UTF-8" if tid.get_cset() == h5py.h5t.CSET_UTF8 else "ASCII"
        return f"variable-length string ({cset})" if tid.is_variable_str() else f"fixed-length string, {size} bytes ({cset})"
    if cls in (h5py.h5t.INTEGER, h5py.h5t.FLOAT):
        kind = "float" if cls == h5py.h5t.FLOAT else "int" if tid.get_sign() != h5py.h5t.SGN_NONE else "uint"
        order = "" if size == 1 else " big-endian" if tid.get_order() == h5py.h5t.ORDER_BE else " little-endian"
        return f"{kind}{size * 8}{order}"
    if cls == h5py.h5t.ENUM:
        return f"enum of {type_text(tid.get_super(), depth + 1)}"
    if cls == h5py.h5t.ARRAY:
        return f"array {tuple(tid.get_array_dims())} of {type_text(tid.get_super(), depth + 1)}"
    if cls == h5py.h5t.COMPOUND:
        return f"compound of {tid.get_nmembers()} fields, {size} bytes"
    names = {
        h5py.h5t.VLEN: "variable-length sequence",
        h5py.h5t.REFERENCE: "reference",
        h5py.h5t.OPAQUE: "opaque",
        h5py.h5t.BITFIELD: "bitfield",
        h5py.h5t.TIME: "time",
    }
    return names.get(cls, f"HDF5 type class {cls}")


def _shape_text(space: h5py.h5s.SpaceID) -> str:
    kind = space.get_simple_extent_type()
    if kind == h5py.h5s.NULL:
        return "null"
    if kind == h5py.h5s.SCALAR:
        return "scalar"
    return str(tuple(int(d) for d in space.get_simple_extent_dims()))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_VALUE_CHARS else f"{text[:MAX_VALUE_CHARS]}… ({len(text):,} characters in all)"


def value_text(value: np.ndarray) -> str:
    """An attribute's value as one line: text for strings, numbers as numpy prints them."""
    if value.dtype.kind == "S":
        texts = [decode_field(item) for item in value.reshape(-1).tolist()]
        shown = texts[0] if value.ndim == 0 else "[" + ", ".join(repr(t) for t in texts) + "]"
    elif value.ndim == 0:
        shown = str(value.item())
    else:
        shown = np.array2string(value, threshold=64, edgeitems=8, max_line_width=MAX_VALUE_CHARS * 4, separator=", ")
        shown = " ".join(shown.split())
    return _cut(printable(shown))


def _attribute_row(dsid: h5py.h5d.DatasetID, location: str, index: int, budget: int) -> AttributeRow:
    try:
        attr = h5py.h5a.open(dsid, index=index)
        raw_name = attr.get_name()
        name = raw_name.decode("utf-8", errors="replace")
        hdf5_type, shape = type_text(attr.get_type()), _shape_text(attr.get_space())
    except HDF5_ERRORS as exc:
        return AttributeRow(f"#{index}", "?", "?", f"cannot be read ({describe_error(exc)})", problem=True)
    shown_name = printable(name)
    if name.encode("utf-8") != raw_name:
        return AttributeRow(shown_name, hdf5_type, shape, "its name is not UTF-8 text; not read", problem=True)
    try:
        value = read_attribute(dsid, location, name, min(budget, MAX_SHOWN_BYTES))
    except UnsafeObject as exc:
        return AttributeRow(shown_name, hdf5_type, shape, exc.problem.problem, problem=True)
    if value is None:
        return AttributeRow(shown_name, hdf5_type, shape, "listed, yet not found by its name; not read", problem=True)
    return AttributeRow(shown_name, hdf5_type, shape, value_text(value))


def index_row(record: Record) -> tuple[tuple[str, str], ...]:
    """The record's index row, field by field, as the file states it."""
    return tuple((name, printable(str(value))) for name, value in zip(record._fields, record))


def _other_records(dsid: h5py.h5d.DatasetID, index: int, seq: int) -> bool:
    """Whether attribute `index` of a pack belongs to another record of it (`NAME[SEQ]`, docs/capture-format.md)."""
    try:
        name = h5py.h5a.open(dsid, index=index).get_name().decode("utf-8", errors="replace")
    except HDF5_ERRORS:
        return False
    found = _PACKED_NAME.search(name)
    return found is not None and int(found.group(1)) != seq


def _table_row(capture: Capture, dsid: h5py.h5d.DatasetID, record: Record, row: AttributeRow) -> AttributeRow:
    """A pack's attribute table (`NAME[]`) shown as the record's own element of it."""
    name = row.name[: -len("[]")]
    attribute = PackedAttributes(capture, name, min(capture.memory_budget, MAX_SHOWN_BYTES))
    try:
        value = attribute.value(dsid, record)
        element = attribute.element(dsid, record)
    except UnsafeObject as exc:
        return AttributeRow(row.name, row.hdf5_type, row.shape, exc.problem.problem, problem=True)
    shown = f"{row.name} element {element}"
    if value is None:
        return AttributeRow(shown, row.hdf5_type, row.shape, "(empty: the recorder gave this record none)")
    return AttributeRow(shown, row.hdf5_type, row.shape, value_text(value))


def _dataset_rows(capture: Capture, location: str, record: Record | None = None) -> tuple[str, tuple[AttributeRow, ...]]:
    """(the dataset's stored type and shape, a row per attribute), reached through checked links only.
    With `record` the dataset is its pack: attributes of the pack's other records are left out, and
    an attribute table shows the record's element."""
    try:
        dsid = capture.walker.dataset_id(location)
    except UnsafeObject as exc:
        return "not opened", (AttributeRow("(dataset)", "?", "?", f"{exc.problem.location}: {exc.problem.problem}", problem=True),)
    try:
        stored = f"{type_text(dsid.get_type())}, shape {tuple(int(d) for d in dsid.shape or ())}"
    except HDF5_ERRORS as exc:
        stored = f"cannot be read ({describe_error(exc)})"
    try:
        count = h5py.h5a.get_num_attrs(dsid)
    except HDF5_ERRORS as exc:
        return stored, (AttributeRow("(attributes)", "?", "?", f"cannot be listed ({describe_error(exc)})", problem=True),)
    mine = [i for i in range(count) if record is None or not _other_records(dsid, i, record.seq)]
    rows = [_attribute_row(dsid, location, i, capture.memory_budget) for i in mine[:MAX_LISTED]]
    if record is not None:
        rows = [_table_row(capture, dsid, record, row) if row.name.endswith("[]") and not row.problem else row for row in rows]
    if len(mine) > MAX_LISTED:
        rows.append(AttributeRow("…", "", "", f"{len(mine) - MAX_LISTED:,} more attributes, not listed", problem=True))
    return stored, tuple(rows)


def record_attributes(capture: Capture, record: Record, side: str) -> RecordAttributes:
    """Everything the file says about one record beside its data; problems are rows, never raised."""
    stored, rows = _dataset_rows(capture, record.path, record if record.packed else None)
    if record.packed and not rows:
        rows = (AttributeRow("(none)", "", "", "its pack holds no attributes for it (a packed tensor's are elements of the pack's tables NAME[])"),)
    return RecordAttributes(side, str(capture.path), printable(record.path), index_row(record), stored, rows)


def iter_records_attributes(sides: list[tuple[str, Capture, Record]]) -> ProgressGenerator[list[RecordAttributes]]:
    """Each (side, capture, record)'s attributes, off the UI thread: h5py holds one lock for every
    read, so a tensor being read elsewhere would otherwise stall the window."""
    found: list[RecordAttributes] = []
    for i, (side, capture, record) in enumerate(sides):
        yield Progress(i, len(sides), f"reading {side} attributes")
        found.append(record_attributes(capture, record, side))
    return found
