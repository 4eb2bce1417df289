"""Lazy capture reader for untrusted files.

The index, dispatch and token tables are each one read; tensors are read on demand, whole or
as a slice, from a dataset of their own or as a byte range of a pack (docs/capture-format.md,
"Packs"); `records` are built from the index only when asked for. Files come from other people's engines (docs/capture-format.md, "What a reader refuses"), so:
- the file is opened read-only with locking off, never blocking the engine that writes it;
- the first open of a file runs its full structural check in a child process
  (`sessions.capture.structure_check`), so a file that crashes or hangs libhdf5 takes the child down,
  not the viewer;
- every object is checked through its metadata (`sessions.capture.hdf5_safety`) before its data is
  read, and index rows are checked against the datasets they point at (a pack once, then each
  row's byte range);
- every problem surfaces as a `CaptureError` naming the file, the place and what is wrong.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from sessions.bits.dtypes import (
    UnknownDtypeError,
    as_values,
    logical_dtype,
    quantized_nbytes,
)
from sessions.capture import format as cf
from sessions.capture.chunk_read import ChunkedReader, has_filters
from sessions.capture.columns import IndexColumns
from sessions.capture.hdf5_safety import (
    DEFAULT_MEMORY_BUDGET,
    HDF5_ERRORS,
    LinkWalker,
    Problem,
    UnsafeObject,
    attribute_problems,
    dataset_problems,
    describe_error,
    read_attribute,
)
from sessions.capture.index_rows import PACKED_BOTH, index_problems
from sessions.capture.meta import CaptureMeta
from sessions.capture.pack_layout import (
    Selection,
    selection_shape,
    stored_nbytes,
    stored_shape,
)
from sessions.capture.pack_read import Pack, read_packed
from sessions.capture.records import Record, Records
from sessions.capture.released_tail import open_unfinished_with_released_tail
from sessions.capture.stored_types import (
    field_problem,
    int_problem,
    past_signed,
    text_problem,
)
from sessions.capture.text_fields import (
    control_character,
    text_control,
)
from sessions.printable import printable
from sessions.side_file import JsonTooDeep, load_json

_TRUNCATED = re.compile(r"truncated file: eof = (\d+),.*stored_eof = (\d+)")
"""libhdf5's words for a file shorter than its superblock says: the bytes there and the bytes it should have."""


def _leading_rows(ds: h5py.Dataset, rows: int) -> np.ndarray:
    """The table's first `rows` rows, read into memory no one zeroed first: h5py's own read
    allocates with numpy.zeros, which took 0.06-0.9 s for a 240,000-row (115 MB) index against
    a steady 0.06 s here (measured on one warm file, fresh processes)."""
    out = np.empty(rows, dtype=ds.dtype)
    if rows:
        file_space = ds.id.get_space()
        file_space.select_hyperslab((0,), (rows,))
        ds.id.read(h5py.h5s.create_simple((rows,)), file_space, out)
    return out


class CaptureError(Exception):
    """A capture that cannot be used as asked, with where and why."""

    def __init__(self, path: str | Path, location: str, problem: str) -> None:
        self.path = str(path)
        self.location = printable(location)
        self.problem = printable(problem)
        super().__init__(f"{self.path}: {location}: {problem}")

    def __reduce__(self) -> tuple[type[CaptureError], tuple[str, str, str]]:
        """Rebuilt from its three parts when it crosses a process boundary (a parallel comparison's worker)."""
        return CaptureError, (self.path, self.location, self.problem)


@dataclass(frozen=True)
class CaptureContents:
    """What a capture holds, for summaries and for explaining an unfinished file."""

    records: int
    steps: int
    tokens: int
    dispatch_events: int
    complete: bool

    def describe(self) -> str:
        held = (
            f"{self.records} records, {self.steps} token steps, {self.tokens} tokens, "
            f"{self.dispatch_events} dispatch events"
        )
        if self.complete:
            return held
        return f"incomplete: the writer did not finish; it holds {held}"


_TABLES: tuple[tuple[str, np.dtype], ...] = (
    (cf.INDEX_PATH, cf.INDEX_DTYPE),
    (cf.DISPATCH_PATH, cf.DISPATCH_DTYPE),
    (cf.TOKENS_PATH, cf.TOKENS_DTYPE),
)


class Capture:
    """An open capture. Use `open_capture`; close it (or use `with`) when done."""

    def __init__(self, path: Path, file: h5py.File, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> None:
        self.path = path
        self._file = file
        self._budget = memory_budget
        self._file_size = path.stat().st_size
        self._walker = LinkWalker(file)
        self._packs: dict[str, tuple[Pack | None, list[Problem]]] = {}
        self._descriptor: int | None = None
        self._pack_decoder: tuple[str, ChunkedReader] | None = None
        self.dropped_rows: dict[str, int] = {}
        """Rows an unfinished writer left past its last committed step, per table (not shown)."""
        with self._reading("/"):
            self.meta, self.complete = self._read_root()
        # The calls and tokens before the index: a writer commits a step's records first, so
        # every committed call and token then has its record, even when a step is committed
        # while the tables are read (a live recording's calls pointed past its index).
        self.dispatch = self._read_table(cf.DISPATCH_PATH, cf.DISPATCH_DTYPE, required=False)
        self.tokens = self._read_table(cf.TOKENS_PATH, cf.TOKENS_DTYPE, required=False)
        self.index = self._read_table(cf.INDEX_PATH, cf.INDEX_DTYPE, required=True)
        if not self.complete:
            self.index = self._committed_index_prefix(self.index)
        self.columns = IndexColumns(self.index)
        """The index's columns as contiguous arrays and codes, for checks over every row at once."""
        self._row_problems: tuple[list[Problem], np.ndarray] | None = None

    @property
    def row_problems(self) -> list[Problem]:
        """Problems of index rows on their own (open_capture refuses a file with any). Found on
        first use: a file whose structure check passed has none, and its open skips them."""
        return self._index_problems()[0]

    @property
    def bad_rows(self) -> np.ndarray:
        """A mask of the rows that have `row_problems`."""
        return self._index_problems()[1]

    def rows_passed_check(self) -> None:
        """The structure check of this file version found no row problems (`iter_open_capture`):
        they are not looked for again (0.1 s per 240,000 rows, paid by every comparison)."""
        self._row_problems = ([], np.zeros(len(self.index), dtype=bool))

    def _index_problems(self) -> tuple[list[Problem], np.ndarray]:
        if self._row_problems is None:
            self._row_problems = index_problems(self.columns)
        return self._row_problems

    @property
    def walker(self) -> LinkWalker:
        """The link walker of this file, for checks that resolve many in-file paths."""
        return self._walker

    @property
    def memory_budget(self) -> int:
        return self._budget

    @property
    def file_size(self) -> int:
        return self._file_size

    def open_object(self, path: str) -> h5py.h5o.ObjectID:
        """The object at `path` in the file this capture opened and checked: reopening the file by
        its name would read whatever stands there now (a file replaced since, unchecked)."""
        if not self._file.id.valid:
            raise self._fail("file", "is closed: reading it again needs it opened again")
        return h5py.h5o.open(self._file.id, path.encode())

    def _fail(self, location: str, problem: str) -> CaptureError:
        return CaptureError(self.path, location, problem)

    @contextmanager
    def _reading(self, place: str) -> Iterator[None]:
        """Failures of reading `place` as the capture's errors, located there. libhdf5 raises many
        types on a crafted file; one that no check foresaw still names what was being read."""
        try:
            yield
        except CaptureError:
            raise
        except UnsafeObject as exc:
            raise self._fail(exc.problem.location, exc.problem.problem) from None
        except Exception as exc:  # noqa: BLE001  (each is a finding about `place`, never a traceback)
            raise self._fail(place, f"cannot be read ({describe_error(exc)})") from None

    def _root_attr(self, name: str) -> np.ndarray | None:
        """A root attribute (an unsafe one raises UnsafeObject, which `_reading` locates)."""
        return read_attribute(self._file.id, "/", name, self._budget)

    def _int_attr(self, obj_id: h5py.h5o.ObjectID, location: str, name: str, default: int) -> int:
        """An integer attribute's value, `default` when absent; refused when present and not one integer."""
        value = read_attribute(obj_id, location, name, self._budget)
        if value is None:
            return default
        problem = int_problem(value)
        if problem is not None:
            raise self._fail(f"{location} attribute '{name}'", problem)
        return int(value)

    def _root_int(self, name: str, default: int) -> int:
        return self._int_attr(self._file.id, "/", name, default)

    def _root_text(self, name: str) -> str:
        """A root text attribute, empty when absent; refused when it is not one string, is not UTF-8
        (as an index field is: with replacement characters it read as other text), or holds a
        control character, which would reach the terminal of whoever reads a report (a
        multi-line one, the prompt, is someone's words: `text_control`)."""
        value = self._root_attr(name)
        if value is None:
            return ""
        problem = text_problem(value)
        if problem is not None:
            raise self._fail(f"/ attribute '{name}'", problem)
        raw = bytes(value[()]).rstrip(b"\0")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            near = raw[max(0, exc.start - 16) : exc.end + 16]  # a prompt may be megabytes long
            raise self._fail(f"/ attribute '{name}'", f"is not UTF-8 text (byte {exc.start}, in {near!r})") from None
        if name in cf.MULTILINE_STRING_ATTRS:
            found = text_control(text)
        else:
            control = control_character(text)
            found = None if control is None else (control, text)
        if found is not None:
            raise self._fail(f"/ attribute '{name}'", f"holds a control character ({printable(found[0])} in '{printable(found[1])}')")
        return text

    def _read_root(self) -> tuple[CaptureMeta, bool]:
        fmt = self._root_text(cf.ATTR_FORMAT)
        if fmt != cf.FORMAT_NAME:
            shown = f"format is {fmt!r}" if fmt else "no 'format' attribute"
            raise self._fail("/ attribute 'format'", f"not a Parity X-ray capture ({shown})")
        version = self._root_int(cf.ATTR_VERSION, -1)
        if version != cf.FORMAT_VERSION:
            shown = "missing" if version == -1 else str(version)
            raise self._fail(
                "/ attribute 'format_version'",
                f"version {shown} is not supported; this reader reads version {cf.FORMAT_VERSION}",
            )
        texts = {name: self._root_text(name) for name in cf.STRING_ATTRS}
        if texts["role"] not in ("", *cf.ROLES):
            raise self._fail("/ attribute 'role'", f"is '{texts['role']}'; a capture's role is one of {', '.join(cf.ROLES)} (or absent)")
        raw_provenance = self._root_attr(cf.ATTR_PROVENANCE)
        provenance: dict[str, Any] = {}
        if raw_provenance is not None:
            if raw_provenance.dtype != np.uint8 or raw_provenance.ndim != 1:
                raise self._fail(
                    "/ attribute 'provenance_json'",
                    f"is {raw_provenance.dtype} of shape {raw_provenance.shape}; the format stores the JSON's bytes as 1-D uint8",
                )
            try:
                provenance = load_json(raw_provenance.tobytes().decode("utf-8"))
            except UnicodeDecodeError:
                raise self._fail("/ attribute 'provenance_json'", "is not UTF-8 text") from None
            except JsonTooDeep as exc:
                raise self._fail("/ attribute 'provenance_json'", str(exc)) from None
            except (ValueError, RecursionError) as exc:
                reason = describe_error(exc) if isinstance(exc, RecursionError) else str(exc)
                raise self._fail("/ attribute 'provenance_json'", f"is not JSON ({reason})") from None
            if not isinstance(provenance, dict):
                raise self._fail("/ attribute 'provenance_json'", f"is a JSON {type(provenance).__name__}; the format holds one JSON object")
        batch_size, batch_row = self._root_int("batch_size", 1), self._root_int("batch_row", 0)
        if batch_size < 1 or not 0 <= batch_row < batch_size:
            raise self._fail("/ attributes 'batch_size', 'batch_row'", f"row {batch_row} of a batch of {batch_size} is not a request of that batch")
        stacked = self._root_int("batch_stacked", 0)
        if stacked not in (0, 1):
            raise self._fail("/ attribute 'batch_stacked'", f"is {stacked}; the format allows 0 or 1")
        meta = CaptureMeta(
            seed=self._root_int("seed", 0), batch_size=batch_size, batch_row=batch_row, batch_stacked=bool(stacked),
            provenance=provenance, **texts,
        )
        return meta, self._root_int(cf.ATTR_COMPLETE, 0) == 1

    def _read_table(self, path: str, dtype: np.dtype, required: bool) -> np.ndarray:
        """One table's rows (a finished writer's, or an unfinished one's committed rows) in the format's dtype."""
        with self._reading(path):
            return self._table_rows(path, dtype, required)

    def _table_rows(self, path: str, dtype: np.dtype, required: bool) -> np.ndarray:
        try:
            ds = self._walker.dataset(path)
        except UnsafeObject:
            if self._file.id.links.exists(path[1:].encode()):
                raise
            if required:
                raise self._fail(path, "missing (every capture has an index table)") from None
            return np.zeros(0, dtype=dtype)
        found = dataset_problems(ds.id, path, self._budget, self._file_size)
        if found:
            raise self._fail(found[0].location, found[0].problem)
        if ds.dtype.names is None or len(ds.shape) != 1:
            raise self._fail(path, f"is not a 1-D compound table (dtype {ds.dtype}, shape {ds.shape})")
        layout_problem = field_problem(ds.dtype, dtype)
        if layout_problem is not None:
            raise self._fail(path, layout_problem)
        committed = self._int_attr(ds.id, path, cf.ATTR_COMMITTED_ROWS, ds.shape[0])
        if committed < 0:  # read as "every row" of an unfinished file, past what its writer had committed
            raise self._fail(f"{path} attribute '{cf.ATTR_COMMITTED_ROWS}'", f"is {committed}; a count of committed rows is at least 0")
        rows = ds.shape[0]
        if not self.complete and committed < rows:
            # Rows past the commit may lie in chunks a killed writer never finished: never read them.
            self.dropped_rows[path] = rows - committed
            rows = committed
        raw = ChunkedReader(ds, path, self._budget, self._file_size).read((slice(0, rows),)) if has_filters(ds) else _leading_rows(ds, rows)
        if raw.dtype == dtype:
            return raw
        table = np.zeros(len(raw), dtype=dtype)
        for name in dtype.names:
            if name in raw.dtype.names:
                wrapped = past_signed(raw[name], dtype[name])
                if wrapped is not None:
                    value = raw[name][wrapped]
                    shown = int(value) if value.ndim == 0 else max(int(v) for v in value.tolist())
                    raise self._fail(f"{path} row {wrapped}", f"{name} holds {shown}, more than the format's {dtype[name].base} holds")
            table[name] = raw[name] if name in raw.dtype.names else cf.INDEX_OPTIONAL_FIELDS[name]
        return table

    def _committed_index_prefix(self, index: np.ndarray) -> np.ndarray:
        """The rows of an unfinished file up to its first torn row (unwritten rows read as zeros)."""
        torn = (index["seq"] != np.arange(len(index))) | (index["path"] == b"")
        if not torn.any():
            return index
        first = int(np.argmax(torn))
        self.dropped_rows[cf.INDEX_PATH] = self.dropped_rows.get(cf.INDEX_PATH, 0) + len(index) - first
        return index[:first]

    @cached_property
    def records(self) -> Records:
        """The index rows as `Record`s, each built the first time it is asked for (sessions.capture.records)."""
        return Records(self.index, self.columns)

    @cached_property
    def names(self) -> list[str]:
        """The distinct record names, from the name column: profile detection asks for them
        before anything needs a record (a cached comparison never does)."""
        return [cf.decode_field(value) for value in self.columns.codes("name")[0]]

    def pack_members(self, path: str) -> np.ndarray:
        """The seqs of the records whose bytes the pack at `path` holds, in order: element i of the
        pack's attribute tables belongs to the i-th (docs/capture-format.md, "Recorder attributes")."""
        return self._packs_members.get(path, np.zeros(0, dtype=np.int64))

    @cached_property
    def _packs_members(self) -> dict[str, np.ndarray]:
        """Every pack's members, grouped once: a reader of attribute tables visits pack after pack."""
        values, codes = self.columns.codes("path")
        rows = np.flatnonzero(self.columns.packed)
        rows = rows[np.argsort(codes[rows], kind="stable")]
        starts = np.flatnonzero(np.concatenate(([True], codes[rows][1:] != codes[rows][:-1]))) if len(rows) else rows
        seqs = self.columns["seq"]
        return {cf.decode_field(values[codes[rows[a]]]): seqs[rows[a:b]] for a, b in zip(starts, [*starts[1:], len(rows)])}

    @cached_property
    def packed_addresses(self) -> np.ndarray:
        """Each index row's file offset where its bytes lie in a pack that is one contiguous run
        of the file (the reference writer's kind) and the row passes every check `stored_span`
        makes; -1 for every other row. Found for all rows at once: a comparison that settles a
        real run's many small records by their bytes asked `stored_span` 480,000 times."""
        addresses = np.full(len(self.index), -1, dtype=np.int64)
        if not len(self.index):
            return addresses
        values, codes = self.columns.codes("path")
        offsets, nbytes = self.columns["offset"], self.columns["nbytes"]
        usable = self.columns.packed & ~self.bad_rows & (offsets >= 0) & (nbytes >= 0)
        starts = np.full(len(values), -1, dtype=np.int64)
        sizes = np.zeros(len(values), dtype=np.int64)
        for code in np.unique(codes[usable]):
            pack, found = self.pack(cf.decode_field(values[code]))
            if pack is not None and not found and pack.address is not None:
                starts[code], sizes[code] = pack.address, pack.size
        usable &= (starts[codes] >= 0) & (offsets + nbytes <= sizes[codes])
        addresses[usable] = starts[codes[usable]] + offsets[usable]
        return addresses

    def record(self, seq: int) -> Record | None:
        """The record with this seq (a comparison or a session names records by seq); None when absent."""
        records = self.records
        if 0 <= seq < len(records) and records[seq].seq == seq:
            return records[seq]
        return next((r for r in records if r.seq == seq), None)

    @property
    def contents(self) -> CaptureContents:
        steps = np.unique(self.columns["step"]).size if len(self.index) else 0
        return CaptureContents(len(self.index), int(steps), len(self.tokens), len(self.dispatch), self.complete)

    def describe(self) -> str:
        """One line for the user: what the file holds, and whether the writer finished it."""
        return self.contents.describe()

    def record_problems(self, record: Record) -> list[Problem]:
        """Everything wrong between one index row and the dataset (or pack) it points at, from metadata only."""
        return self._inspect(record)[1]

    def _inspect(self, record: Record) -> tuple[h5py.Dataset | None, list[Problem]]:
        where = f"/index row {record.seq} ({record.name})"
        try:
            ld = logical_dtype(record.dtype)
        except UnknownDtypeError as exc:
            return None, [Problem(where, str(exc))]
        if record.packed:
            return self._inspect_packed(record, where)
        try:
            ds = self._walker.dataset_id(record.path)
        except UnsafeObject as exc:
            return None, [Problem(f"{where} -> {exc.problem.location}", exc.problem.problem)]
        found = dataset_problems(ds, record.path, self._budget, self._file_size)
        found += attribute_problems(ds, record.path, self._budget)
        if found:
            return None, found
        try:
            logical_attr = read_attribute(ds, record.path, cf.ATTR_LOGICAL_DTYPE, self._budget)
            shape_attr = read_attribute(ds, record.path, cf.ATTR_LOGICAL_SHAPE, self._budget) if ld.is_quantized else None
        except UnsafeObject as exc:
            return None, [exc.problem]
        not_text = None if logical_attr is None else text_problem(logical_attr)
        stored_logical = "" if logical_attr is None or not_text is not None else cf.decode_field(logical_attr[()])
        if not_text is not None or stored_logical != record.dtype:
            found.append(
                Problem(f"{record.path} attribute 'logical_dtype'", not_text or f"is {stored_logical!r}; the index row says {record.dtype!r}")
            )
        stored = ds.dtype
        if stored != ld.storage:
            found.append(Problem(record.path, f"stored as {stored}; logical {record.dtype} is stored as {ld.storage}"))
        shape = tuple(ds.shape or ())
        if ld.is_quantized:
            found += _quantized_problems(shape, record, ld.ggml_type or "", shape_attr)
        elif shape != record.shape:
            found.append(Problem(record.path, f"has shape {shape}; the index row says {record.shape}"))
        return h5py.Dataset(ds), found

    def pack(self, path: str) -> tuple[Pack | None, list[Problem]]:
        """The pack at `path` and what keeps it from holding records' bytes, checked once per
        pack whatever number of records it holds. None when the path does not lead to a
        dataset (the problems then say where along the path)."""
        known = self._packs.get(path)
        if known is None:
            known = self._packs[path] = self._check_pack(path)
        return known

    def _check_pack(self, path: str) -> tuple[Pack | None, list[Problem]]:
        try:
            dsid = self._walker.dataset_id(path)
        except UnsafeObject as exc:
            return None, [exc.problem]
        address = self._plain_pack_address(dsid)
        found = [] if address is not None else dataset_problems(dsid, path, self._budget, self._file_size)
        found += attribute_problems(dsid, path, self._budget)
        dataset = h5py.Dataset(dsid)
        if found:
            return Pack(dataset, -1, None, False), found
        tid = dsid.get_type()
        if tid.get_class() != h5py.h5t.INTEGER or tid.get_size() != 1 or tid.get_sign() != h5py.h5t.SGN_NONE:
            kind = "an enum of " if tid.get_class() == h5py.h5t.ENUM else ""
            found.append(Problem(path, f"is a pack of {kind}{tid.dtype}; a pack holds bytes (H5T_STD_U8LE)"))
        if len(dsid.shape) != 1:
            found.append(Problem(path, f"is a pack of shape {dsid.shape}; a pack is 1-D"))
            return Pack(dataset, -1, None, False), found
        return Pack(dataset, int(dsid.shape[0]), address, address is None and has_filters(dataset)), found

    def _plain_pack_address(self, dsid: h5py.h5d.DatasetID) -> int | None:
        """Where a pack's bytes start in the file when it is the reference writer's kind: one
        contiguous run inside the file, within the budget; None otherwise. An address for its
        data means contiguous storage, which rules out filters, external raw data and virtual
        layouts, so such a pack needs none of `dataset_problems`' property-list reads."""
        try:
            offset, shape, tid = dsid.get_offset(), dsid.shape, dsid.get_type()
        except HDF5_ERRORS:
            return None
        if offset is None or len(shape) != 1 or tid.get_class() != h5py.h5t.INTEGER or tid.get_size() != 1:
            return None
        return int(offset) if shape[0] <= self._budget and offset + shape[0] <= self._file_size else None

    def _inspect_packed(self, record: Record, where: str) -> tuple[h5py.Dataset | None, list[Problem]]:
        pack, found = self.pack(record.path)
        if pack is None:
            return None, [Problem(f"{where} -> {p.location}", p.problem) for p in found]
        if found:
            return pack.dataset, found
        return pack.dataset, _range_problems(record, where, pack.size)

    def _checked_dataset(self, record: Record) -> h5py.Dataset:
        ds, found = self._inspect(record)
        if found or ds is None:
            first = found[0] if found else Problem(record.path, "cannot be opened")
            raise self._fail(first.location, first.problem)
        return ds

    def chunked_reader(self, record: Record, dataset: h5py.Dataset) -> ChunkedReader | None:
        """The bounded chunk decoder of a record's filtered dataset or pack; None when libhdf5 reads it as stored.

        A pack's decoder is kept while records of that pack are read (it keeps the chunk it
        decoded last, which the next small record of the pack most likely shares)."""
        if record.packed:
            pack = self._packs[record.path][0]
            if pack is None or not pack.filtered:
                return None
            if self._pack_decoder is None or self._pack_decoder[0] != record.path:
                self._pack_decoder = (record.path, ChunkedReader(dataset, record.path, self._budget, self._file_size))
            return self._pack_decoder[1]
        return ChunkedReader(dataset, record.path, self._budget, self._file_size) if has_filters(dataset) else None

    @property
    def descriptor(self) -> int | None:
        """libhdf5's own descriptor of the open file, for reading contiguous packs' bytes with
        pread (libhdf5 costs about 40 us per read, a pread 2). Its own, not the path opened
        again: a file replaced at that path since must not be read. None where its driver has
        no descriptor or os.preadv does not exist."""
        if self._descriptor is None and hasattr(os, "preadv") and self._file.driver == "sec2":
            self._descriptor = int(self._file.id.get_vfd_handle())
        return self._descriptor

    def read_bits(self, record: Record, selection: Selection = None) -> np.ndarray:
        """The stored bits of a tensor (uint16 for bfloat16, raw bytes for quantized blocks)."""
        return RecordReader(self, record).read(selection)

    def read_values(self, record: Record, selection: tuple[slice | int, ...] | None = None) -> np.ndarray:
        """A tensor's values for display: bfloat16 through ml_dtypes, quantized blocks decoded."""
        ld = logical_dtype(record.dtype)
        if not ld.is_quantized:
            return as_values(self.read_bits(record, selection), record.dtype)
        return self.decode_blocks(record, self.read_bits(record))[selection or ()]

    def decode_blocks(self, record: Record, blocks: np.ndarray) -> np.ndarray:
        """A quantized record's stored blocks (as `read_bits` returns them) decoded to its logical
        shape, for a caller that also keeps the blocks; refused past the memory budget."""
        decoded_bytes = record.size * 4
        if decoded_bytes > self._budget:
            raise self._fail(record.path, f"decodes to {decoded_bytes} bytes, over the memory budget of {self._budget}")
        return as_values(blocks, record.dtype).reshape(record.shape)

    def close(self) -> None:
        self._file.close()
        self._descriptor = None

    def __enter__(self) -> "Capture":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _quantized_problems(
    stored_shape: tuple[int, ...], record: Record, ggml_type: str, shape_attr: np.ndarray | None
) -> list[Problem]:
    if shape_attr is not None and shape_attr.dtype.kind not in "iu":
        return [Problem(f"{record.path} attribute 'logical_shape'", f"is of type {shape_attr.dtype}; the format stores 64-bit integers")]
    shown = None if shape_attr is None else tuple(int(d) for d in shape_attr.reshape(-1))
    if shown != record.shape:
        return [Problem(f"{record.path} attribute 'logical_shape'", f"is {shown}; the index row says {record.shape}")]
    try:
        expected = quantized_nbytes(ggml_type, record.shape)
    except ValueError as exc:
        return [Problem(record.path, str(exc))]
    stored_bytes = int(np.prod(stored_shape, dtype=np.int64))
    if stored_bytes != expected:
        return [Problem(record.path, f"holds {stored_bytes} bytes; {ggml_type} blocks of logical shape {record.shape} take {expected}")]
    return []


def _range_problems(record: Record, where: str, pack_bytes: int) -> list[Problem]:
    """Whether a packed record's byte range is its tensor's size and lies inside its pack."""
    if record.offset < 0 or record.nbytes < 0:
        return [Problem(where, PACKED_BOTH)]
    try:
        expected = stored_nbytes(record.dtype, record.shape)
    except ValueError as exc:
        return [Problem(where, str(exc))]
    if record.nbytes != expected:
        return [Problem(where, f"nbytes is {record.nbytes}; a {record.dtype} tensor of shape {record.shape} takes {expected}")]
    if record.offset + record.nbytes > pack_bytes:
        end = record.offset + record.nbytes
        return [Problem(where, f"its bytes [{record.offset}, {end}) end past its pack {record.path} ({pack_bytes} bytes)")]
    return []


GROWING_RETRIES = 5
GROWING_WAIT_S = 0.1
"""A file shorter than its superblock says is looked at again after GROWING_WAIT_S, up to
GROWING_RETRIES times while it keeps growing: a writer's flush lands within a few (`_open_hdf5`)."""


def _open_hdf5(path: Path) -> h5py.File:
    """The file opened for reading. One that is shorter than its superblock says, and grows while
    it is looked at, is a recording being written, not a file cut short: it is opened again once
    the writer's flush has reached the disk (`validate` every 0.4 s of a recording called it "cut
    short" 1 time in 6 to 1 in 89)."""
    attempts = 0
    while True:
        size = _size(path)
        try:
            return h5py.File(path, "r", locking=False)
        except OSError as exc:
            cut = _TRUNCATED.search(str(exc))
            if cut is None:
                raise CaptureError(path, "file", f"not a readable HDF5 file ({exc})") from None
        attempts += 1
        time.sleep(GROWING_WAIT_S)
        if attempts > GROWING_RETRIES or _size(path) == size:
            present, whole = int(cut.group(1)), int(cut.group(2))
            released = open_unfinished_with_released_tail(path, present, whole)
            if released is not None:
                return released
            raise CaptureError(path, "file", f"cut short: {present:,} of its {whole:,} bytes are there (a copy or download that did not finish)")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise CaptureError(path, "file", f"cannot be read ({exc.strerror})") from None


def load_capture(path: Path, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Capture:
    """Open a capture in this process with no child check and no refusal of bad index rows.

    For the structural check itself, which must list every problem; everyone else uses
    `open_capture`.
    """
    try:
        empty = path.stat().st_size == 0
    except OSError as exc:
        raise CaptureError(path, "file", f"cannot be read ({exc.strerror})") from None
    if empty:
        raise CaptureError(path, "file", "is empty (0 bytes); a capture is an HDF5 file")
    file = _open_hdf5(path)
    try:
        return Capture(path, file, memory_budget=memory_budget)
    except CaptureError:
        file.close()
        raise
    except OSError as exc:  # the file itself: gone or replaced since it was opened (what it holds is located by Capture)
        file.close()
        raise CaptureError(path, "file", f"cannot be read ({describe_error(exc)})") from None


class RecordReader:
    """One record's dataset (or pack), checked once, then read slice by slice into the caller's arrays.

    A streaming comparison reads a large record in dozens of slices. `Capture.read_bits` checks
    the dataset's metadata on every call (about what copying a few MiB from the page cache
    costs) and returns a fresh array (whose page faults cost more than the copy); `read_into`
    does neither. A packed record's slice is a run of its pack's bytes, read straight into
    the caller's array. Quantized records are read whole: their stored shape is GGML blocks,
    not the record's shape.
    """

    def __init__(self, capture: Capture, record: Record) -> None:
        self._capture = capture
        self._record = record
        self._dataset = capture._checked_dataset(record)
        with self._located():
            self._chunked = capture.chunked_reader(record, self._dataset)
        self._storage = logical_dtype(record.dtype).storage
        self._pack = capture.pack(record.path)[0] if record.packed else None

    def read(self, selection: Selection = None) -> np.ndarray:
        """Stored bits of the record, or of `selection`, in a new array."""
        with self._located():
            if self._record.packed:
                shape = selection_shape(stored_shape(self._record.dtype, self._record.shape), selection)
                return self.read_into(np.empty(shape, dtype=self._storage), selection)
            if self._chunked is not None:
                bits = self._chunked.read(selection)
            else:
                bits = self._dataset[()] if selection is None else self._dataset[selection]
        refuse_bool_bytes(self._capture.path, self._record, bits)
        return bits

    def read_into(self, out: np.ndarray, selection: Selection = None) -> np.ndarray:
        """Stored bits of the record, or of `selection`, into `out` (C-contiguous, the
        selection's shape, the stored dtype), which is returned."""
        with self._located():
            if self._pack is not None:
                shape = stored_shape(self._record.dtype, self._record.shape)
                descriptor = self._capture.descriptor
                out = read_packed(self._pack, descriptor, self._chunked, self._record.offset, shape, self._storage, selection, out)
            elif self._chunked is not None:
                out[...] = self._chunked.read(selection)
            else:
                self._dataset.read_direct(out, selection)
        refuse_bool_bytes(self._capture.path, self._record, out)
        return out

    @contextmanager
    def _located(self) -> Iterator[None]:
        """Failures of a read as the capture's errors: where, and libhdf5's words."""
        try:
            yield
        except UnsafeObject as exc:
            raise self._capture._fail(exc.problem.location, exc.problem.problem) from None
        except (*HDF5_ERRORS, IndexError) as exc:
            raise self._capture._fail(self._record.path, f"data cannot be read ({describe_error(exc)})") from None


def refuse_bool_bytes(path: str | Path, record: Record, stored: np.ndarray) -> None:
    """A bool is stored as one byte, 0 or 1 (docs/capture-format.md). Any other byte reads as
    True, as 1 does: two records whose bytes differ compared equal element by element, and the
    comparison, told their bits differ, found no differing element and failed."""
    if record.dtype != "bool":
        return
    raw = np.ascontiguousarray(stored).view(np.uint8).reshape(-1)
    bad = np.flatnonzero(raw > 1)
    if bad.size:
        raise CaptureError(
            path, f"/index row {record.seq} ({record.name})",
            f"holds byte {int(raw[bad[0]]):#04x} for a bool ({bad.size:,} of the {raw.size:,} bytes read are neither 0 nor 1); a bool is stored as one byte, 0 or 1",
        )


def stored_span(capture: Capture, record: Record) -> tuple[int, int] | None:
    """(file offset, bytes) of a record's stored data when it is one contiguous run of the file,
    from metadata only; None for chunked storage or a record that fails its checks (its read
    reports that). For read-ahead: telling the kernel which bytes come next."""
    try:
        ds = capture._checked_dataset(record)
        if record.packed:
            pack = capture.pack(record.path)[0]
            return None if pack is None or pack.address is None else (pack.address + record.offset, record.nbytes)
        offset = ds.id.get_offset()
        return None if offset is None else (int(offset), int(ds.id.get_storage_size()))
    except (CaptureError, OSError, ValueError, TypeError):
        return None
