"""The structural check of every index row's dataset or pack, fast enough for a million records.

A packed row needs no object of its own: each pack is checked once (`Capture.pack`) and every
row's byte range against its pack's size in one pass over the index columns. The rest of this
module is about rows whose tensor is a dataset of its own (files from older writers).

`Capture.record_problems` checks one row thoroughly (links walked part by part, the dataset
creation property list, the element type translated to numpy, attributes read through
h5py's high-level conversions): about 200 us a row, seconds for a large capture, paid before
the user sees anything. Nearly every row of a real capture is the same clean case: a hard
link in an already-resolved group to a contiguous, unfiltered dataset whose HDF5 type is
exactly the logical dtype's storage type. This scan proves that case with the fewest
low-level calls and hands every row that deviates in any way to `record_problems`, so the
problems reported (and their wording) are exactly the thorough check's; a deviation only
costs time. It runs in the checking child process, where a libhdf5 crash is survivable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import h5py
import numpy as np

from sessions.bits.dtypes import LOGICAL_DTYPES
from sessions.capture import format as cf
from sessions.capture.hdf5_safety import (
    HDF5_ERRORS,
    Problem,
    UnsafeObject,
    attribute_problems,
    describe_error,
)
from sessions.capture.index_rows import listed
from sessions.capture.reader import Capture
from sessions.capture.records import record_from_row

PROGRESS_EVERY_ROWS = 200

_MESSAGE_DATATYPE = 1 << 0x0003
_MESSAGE_EXTERNAL_FILES = 1 << 0x0007
_MESSAGE_LAYOUT = 1 << 0x0008
_MESSAGE_FILTER_PIPELINE = 1 << 0x000B
"""Object header message type bits (HDF5 file format spec, section IV.A.2) in `H5O_hdr_info_t.mesg.present`."""

_ATTR_LOGICAL_DTYPE = cf.ATTR_LOGICAL_DTYPE.encode()


@dataclass(frozen=True)
class _Expected:
    """What a clean dataset of one logical dtype looks like to libhdf5."""

    type_id: h5py.h5t.TypeID
    itemsize: int
    attr_type_id: h5py.h5t.TypeID
    """The `logical_dtype` attribute's type as the reference writer makes it (other writers take the general test)."""


def _expectations() -> dict[bytes, _Expected]:
    """Plain (not quantized) logical dtypes by their index-row bytes; quantized rows take the thorough path."""
    return {
        name.encode(): _Expected(
            h5py.h5t.py_create(ld.storage), ld.storage.itemsize, h5py.h5t.py_create(cf.utf8(len(name)))
        )
        for name, ld in LOGICAL_DTYPES.items()
        if not ld.is_quantized
    }


class _Group:
    """A group reached through checked links, with the type of every link in it from one iteration."""

    def __init__(self, group_id: h5py.h5g.GroupID) -> None:
        self.id = group_id
        self.hard: set[bytes] = set()

        def note(name: bytes, info: h5py.h5l.LinkInfo) -> None:
            if info.type == h5py.h5l.TYPE_HARD:
                self.hard.add(name)

        group_id.links.iterate(note, info=True)


class RecordScan:
    """Checks index rows' datasets of one open capture; groups are resolved and listed once per parent path."""

    def __init__(self, capture: Capture) -> None:
        self._capture = capture
        self._walker = capture.walker
        self._budget = capture.memory_budget
        self._file_size = capture.file_size
        self._expected = _expectations()
        self._groups: dict[bytes, _Group | None] = {}
        self._group_failures: dict[bytes, Problem] = {}
        self._failure: Problem | None = None
        """The first libhdf5 failure the fast path met on the current row, if any (see `problems`)."""
        self.thorough_rows = 0
        """Rows that left the fast path for `record_problems` (a clean capture from the reference writer has none)."""

    def _group(self, parent: bytes) -> _Group | None:
        """The group a parent path leads to through checked links, or None when it does not (thorough path)."""
        if parent not in self._groups:
            where = parent.decode("utf-8", errors="replace") or "/"
            try:
                resolved = self._walker.resolve(where)
                self._groups[parent] = _Group(self._walker.group_id(resolved))
            except UnsafeObject as exc:
                self._groups[parent], self._group_failures[parent] = None, exc.problem
            except HDF5_ERRORS as exc:
                self._groups[parent] = None
                self._group_failures[parent] = Problem(where, f"its links cannot be listed ({describe_error(exc)})")
        return self._groups[parent]

    def _is_clean(self, path: bytes, dtype: bytes, shape: tuple[int, ...]) -> bool:
        """Whether the row's dataset is the common clean case; False sends the row to the thorough check."""
        self._failure = None
        expected = self._expected.get(dtype)
        if expected is None or not path.startswith(b"/") or not path.isascii():
            return False
        parent, _, name = path.rpartition(b"/")
        group = self._group(parent) if name not in (b"", b".", b"..") else None
        if group is None or name not in group.hard:
            self._failure = self._group_failures.get(parent)
            return False
        try:
            dsid = h5py.h5d.open(group.id, name)
            if not dsid.get_type() == expected.type_id or dsid.get_space().get_simple_extent_dims() != shape:
                return False
            declared = expected.itemsize * math.prod(shape)
            info = h5py.h5o.get_info(dsid)
            if declared > self._budget or not self._storage_is_clean(dsid, info, declared):
                return False
            if info.num_attrs > 1 and attribute_problems(dsid, "", self._budget):
                return False
            return self._logical_dtype_matches(dsid, dtype, expected.attr_type_id)
        except HDF5_ERRORS as exc:
            self._failure = Problem(path.decode("utf-8", errors="replace"), f"cannot be read ({describe_error(exc)})")
            return False

    def _storage_is_clean(self, dsid: h5py.h5d.DatasetID, info: h5py.h5o.ObjInfo, declared: int) -> bool:
        """Contiguous, inside the file, no external raw data, no filter pipeline.

        `H5Dget_offset` is defined only for contiguous storage without external files, so an
        offset rules out virtual, chunked, compact and external layouts in one call; the header's
        message bits rule out a filter pipeline without copying the creation property list.
        """
        offset = dsid.get_offset()
        if offset is None:
            return False
        present = info.hdr.mesg.present
        if present & (_MESSAGE_DATATYPE | _MESSAGE_LAYOUT) != (_MESSAGE_DATATYPE | _MESSAGE_LAYOUT):
            return False
        if present & (_MESSAGE_FILTER_PIPELINE | _MESSAGE_EXTERNAL_FILES):
            return False
        return declared == 0 or offset + declared <= self._file_size

    def _logical_dtype_matches(self, dsid: h5py.h5d.DatasetID, dtype: bytes, usual_type: h5py.h5t.TypeID) -> bool:
        """The `logical_dtype` attribute is one fixed-length string (a scalar, not an array of one) equal to the row's dtype."""
        attr = h5py.h5a.open(dsid, _ATTR_LOGICAL_DTYPE)
        type_id = attr.get_type()
        if not type_id == usual_type and (type_id.get_class() != h5py.h5t.STRING or type_id.is_variable_str()):
            return False
        size = type_id.get_size()
        if attr.get_space().get_simple_extent_type() != h5py.h5s.SCALAR or attr.get_storage_size() != size:
            return False
        value = np.empty((), dtype=f"S{size}")
        attr.read(value, mtype=type_id)
        return value.item().rstrip(b"\0") == dtype

    def problems(
        self,
        start: int,
        stop: int,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[Problem]:
        """Problems of index rows start..stop-1 (rows with row-level problems are skipped: those are reported already)."""
        index = self._capture.index[start:stop]
        usable = ~self._capture.bad_rows[start:stop]
        packed = self._capture.columns.packed[start:stop]
        found = self._pack_problems(start, np.flatnonzero(packed & usable) + start)
        rows = index[~packed & usable]
        seqs = rows["seq"].tolist()
        paths = rows["path"].tolist()
        dtypes = rows["dtype"].tolist()
        ndims = rows["ndim"].tolist()
        shapes = rows["shape"].tolist()
        total = stop - start
        done = total - len(rows)
        for i in range(len(rows)):
            if progress is not None and i % PROGRESS_EVERY_ROWS == 0:
                progress(done + i, total)
            if self._is_clean(paths[i], dtypes[i], tuple(shapes[i][: ndims[i]])):
                found += self._reaches_a_pack(seqs[i], paths[i])
                continue
            self.thorough_rows += 1
            record = record_from_row(rows[i])
            thorough = self._capture.record_problems(record)
            if not thorough and self._failure is not None:
                # libhdf5 failed once and not when asked again (a damaged heap it half-cached on the
                # first try): a reader that asks first would fail, so the first failure stands.
                where = f"/index row {record.seq} ({record.name}) -> {self._failure.location}"
                thorough = [Problem(where, self._failure.problem)]
            found += thorough or self._reaches_a_pack(seqs[i], paths[i])
        if progress is not None:
            progress(total, total)
        return found

    def _pack_problems(self, start: int, rows: np.ndarray) -> list[Problem]:
        """Problems of packed rows `rows` (in order): each pack checked once, every row's byte range at once.

        A pack is reported by the shard holding its first row, so problems are not repeated
        when shards' reports are merged."""
        if not len(rows):
            return []
        index, columns = self._capture.index, self._capture.columns
        paths, path_codes = columns.codes("path")
        packs, row_pack = np.unique(path_codes[rows], return_inverse=True)
        first = np.full(len(packs), len(rows), dtype=np.int64)
        np.minimum.at(first, row_pack, np.arange(len(rows)))
        earlier = path_codes[:start][columns.packed[:start] & ~self._capture.bad_rows[:start]]
        owned = ~np.isin(packs, earlier)
        sizes = np.full(len(packs), -1, dtype=np.int64)
        found: list[Problem] = []
        for number, code in enumerate(packs.tolist()):
            path = cf.decode_field(paths[code])
            pack, problems = self._capture.pack(path)
            if not problems and pack is not None:
                sizes[number] = pack.size
            elif owned[number]:
                row = int(rows[first[number]])
                where = f"/index row {row} ({cf.decode_field(index['name'][row])})"
                found += problems if pack is not None else [Problem(f"{where} -> {p.location}", p.problem) for p in problems]
            if owned[number] and pack is not None:
                found += self._second_path(int(rows[first[number]]), pack.dataset.id)
        size = sizes[row_pack]
        offsets, nbytes = columns["offset"][rows], columns["nbytes"][rows]
        beyond = (size >= 0) & (offsets > size - nbytes)

        def describe(at: int) -> Problem:
            row, end = int(rows[at]), int(offsets[at]) + int(nbytes[at])
            where = f"/index row {row} ({cf.decode_field(index['name'][row])})"
            pack = cf.decode_field(index["path"][row])
            return Problem(where, f"its bytes [{int(offsets[at])}, {end}) end past its pack {pack} ({int(size[at])} bytes)")

        return found + listed(beyond, describe, "bytes end past their pack")

    @cached_property
    def _pack_namers(self) -> dict[tuple[int, ...], int]:
        """The first row naming each pack, by the pack's object (`_object_of`): a later path that
        reaches the same pack (a soft or hard link, another spelling) names a pack whose byte
        ranges were checked apart from each other's. Opens every pack once (`Capture.pack`), also
        those of other shards' rows."""
        columns, capture = self._capture.columns, self._capture
        paths, path_codes = columns.codes("path")
        rows = np.flatnonzero(columns.packed & ~capture.bad_rows)
        _, first = np.unique(path_codes[rows], return_index=True)
        namers: dict[tuple[int, ...], int] = {}
        for row in rows[np.sort(first)].tolist():
            pack = capture.pack(cf.decode_field(paths[path_codes[row]]))[0]
            found = None if pack is None else _object_of(pack.dataset.id)
            if found is not None:
                namers.setdefault(found, row)
        return namers

    def _where(self, row: int) -> str:
        return f"/index row {row} ({cf.decode_field(self._capture.index['name'][row])})"

    def _path_of(self, row: int) -> str:
        return cf.decode_field(self._capture.index["path"][row])

    def _namer(self, dsid: h5py.h5d.DatasetID) -> int | None:
        """The first row naming the pack this dataset is, or None when it is no pack."""
        found = _object_of(dsid)
        return None if found is None else self._pack_namers.get(found)

    def _second_path(self, row: int, dsid: h5py.h5d.DatasetID) -> list[Problem]:
        """A pack's first row whose path reaches a pack an earlier row names by another path."""
        namer = self._namer(dsid)
        if namer is None or namer == row:
            return []
        return [
            Problem(
                self._where(row),
                f"its pack {self._path_of(row)} is the pack /index row {namer} names {self._path_of(namer)}; "
                "a pack is named by one path (not another spelling, soft link or hard link)",
            )
        ]

    def _reaches_a_pack(self, row: int, path: bytes) -> list[Problem]:
        """A row naming a dataset of its own whose path reaches a pack by another path than the pack's rows use."""
        if not self._pack_namers:
            return []
        try:
            dsid = self._walker.dataset_id(cf.decode_field(path))
        except UnsafeObject:
            return []  # the row's own check reported it
        namer = self._namer(dsid)
        if namer is None:
            return []
        pack = f"{self._path_of(namer)}, named by /index row {namer}"
        return [Problem(self._where(row), f"its dataset is also a pack of other rows' bytes ({pack}, reached by another path)")]


def _object_of(dsid: h5py.h5d.DatasetID) -> tuple[int, ...] | None:
    """The object a dataset handle is (its header's place in the file), the same whatever path
    reached it; None when libhdf5 cannot say (the object's own check reports why)."""
    try:
        return tuple(h5py.h5g.get_objinfo(dsid).objno)
    except HDF5_ERRORS:
        return None


def scan_problems(
    capture: Capture,
    start: int = 0,
    stop: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Problem]:
    """Every problem between index rows start..stop-1 and their datasets, as `record_problems` words them."""
    end = len(capture.index) if stop is None else stop
    return RecordScan(capture).problems(start, end, progress)

