"""Lazy capture reader for untrusted files.

The index, dispatch and token tables are each one read; tensors are read on demand, whole or
as a slice. Files come from other people's engines (GUIDE section 7), so:
- the file is opened read-only with locking off, never blocking the engine that writes it;
- the first open of a file runs its full structural check in a child process
  (`sessions.capture.structure_check`), so a file that crashes or hangs libhdf5 takes the child down,
  not the viewer;
- every object is checked through its metadata (`sessions.capture.hdf5_safety`) before its data is
  read, and index rows are checked against the datasets they point at;
- every problem surfaces as a `CaptureError` naming the file, the place and what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from sessions.bits.dtypes import (
    LOGICAL_DTYPES,
    UnknownDtypeError,
    as_values,
    logical_dtype,
    quantized_nbytes,
)
from sessions.capture import format as cf
from sessions.capture.chunk_read import ChunkedReader, has_filters
from sessions.capture.hdf5_safety import (
    DEFAULT_MEMORY_BUDGET,
    HDF5_ERRORS,
    LinkWalker,
    Problem,
    UnsafeObject,
    attribute_problems,
    dataset_problems,
    describe_error,
    printable,
    read_attribute,
)
from sessions.capture.meta import CaptureMeta


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
class Record:
    """One captured tensor, as its index row describes it."""

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

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def record_from_row(row: np.void) -> Record:
    ndim = int(row["ndim"])
    return Record(
        seq=int(row["seq"]),
        step=int(row["step"]),
        segment=cf.decode_field(row["segment"]),
        layer=int(row["layer"]),
        name=cf.decode_field(row["name"]),
        occurrence=int(row["occurrence"]),
        dtype=cf.decode_field(row["dtype"]),
        shape=tuple(int(d) for d in row["shape"][:ndim]),
        path=cf.decode_field(row["path"]),
        kernel_id=cf.decode_field(row["kernel_id"]),
        contract_id=cf.decode_field(row["contract_id"]),
        effective_contract_id=cf.decode_field(row["effective_contract_id"]),
        t_start_ns=int(row["t_start_ns"]),
        t_end_ns=int(row["t_end_ns"]),
        position=int(row["position"]),
    )


def _text_column(column: np.ndarray) -> list[str]:
    return [cf.decode_field(raw) for raw in column.tolist()]


def records_from_index(index: np.ndarray) -> list[Record]:
    """All records of an index table, built column-wise: 50,000 rows in well under a second."""
    texts = {name: _text_column(index[name]) for name in cf.INDEX_STRING_FIELDS}
    ints = {name: index[name].tolist() for name in cf.INDEX_INT_FIELDS}
    ndims = index["ndim"].tolist()
    shapes = index["shape"].tolist()
    return [
        Record(
            seq=ints["seq"][i],
            step=ints["step"][i],
            segment=texts["segment"][i],
            layer=ints["layer"][i],
            name=texts["name"][i],
            occurrence=ints["occurrence"][i],
            dtype=texts["dtype"][i],
            shape=tuple(shapes[i][: ndims[i]]),
            path=texts["path"][i],
            kernel_id=texts["kernel_id"][i],
            contract_id=texts["contract_id"][i],
            effective_contract_id=texts["effective_contract_id"][i],
            t_start_ns=ints["t_start_ns"][i],
            t_end_ns=ints["t_end_ns"][i],
            position=ints["position"][i],
        )
        for i in range(len(index))
    ]


def _attr_text(value: np.ndarray | None) -> str:
    if value is None:
        return ""
    item = value.reshape(-1)[0] if value.size else b""
    if isinstance(item, (bytes, np.bytes_)):
        return cf.decode_field(item)
    return str(item)


def _attr_int(value: np.ndarray | None, default: int) -> int:
    if value is None or value.size != 1 or value.dtype.kind not in "iub":
        return default
    return int(value.reshape(-1)[0])


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
        self.dropped_rows: dict[str, int] = {}
        """Rows an unfinished writer left past its last committed step, per table (not shown)."""
        self.meta, self.complete = self._read_root()
        self.index = self._read_table(cf.INDEX_PATH, cf.INDEX_DTYPE, required=True)
        self.dispatch = self._read_table(cf.DISPATCH_PATH, cf.DISPATCH_DTYPE, required=False)
        self.tokens = self._read_table(cf.TOKENS_PATH, cf.TOKENS_DTYPE, required=False)
        if not self.complete:
            self.index = self._committed_index_prefix(self.index)
        self.row_problems, self.bad_rows = index_problems(self.index)
        """Problems of index rows on their own, and a mask of the rows that have them (open_capture refuses these)."""

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

    def _fail(self, location: str, problem: str) -> CaptureError:
        return CaptureError(self.path, location, problem)

    def _root_attr(self, name: str) -> np.ndarray | None:
        try:
            return read_attribute(self._file.id, "/", name, self._budget)
        except UnsafeObject as exc:
            raise self._fail(exc.problem.location, exc.problem.problem) from None

    def _read_root(self) -> tuple[CaptureMeta, bool]:
        fmt = _attr_text(self._root_attr(cf.ATTR_FORMAT))
        if fmt != cf.FORMAT_NAME:
            shown = f"format is {fmt!r}" if fmt else "no 'format' attribute"
            raise self._fail("/ attribute 'format'", f"not a Parity X-ray capture ({shown})")
        version = _attr_int(self._root_attr(cf.ATTR_VERSION), -1)
        if version != cf.FORMAT_VERSION:
            shown = "missing" if version == -1 else str(version)
            raise self._fail(
                "/ attribute 'format_version'",
                f"version {shown} is not supported; this reader reads version {cf.FORMAT_VERSION}",
            )
        texts = {name: _attr_text(self._root_attr(name)) for name in cf.STRING_ATTRS}
        raw_provenance = self._root_attr(cf.ATTR_PROVENANCE)
        provenance: dict[str, Any] = {}
        if raw_provenance is not None:
            if raw_provenance.dtype != np.uint8:
                raise self._fail("/ attribute 'provenance_json'", f"is {raw_provenance.dtype}; the format stores uint8 bytes")
            try:
                provenance = json.loads(raw_provenance.tobytes().decode("utf-8"))
            except UnicodeDecodeError:
                raise self._fail("/ attribute 'provenance_json'", "is not UTF-8 text") from None
            except (ValueError, RecursionError) as exc:
                reason = describe_error(exc) if isinstance(exc, RecursionError) else str(exc)
                raise self._fail("/ attribute 'provenance_json'", f"is not JSON ({reason})") from None
            if not isinstance(provenance, dict):
                raise self._fail("/ attribute 'provenance_json'", f"is a JSON {type(provenance).__name__}; the format holds one JSON object")
        batch_size, batch_row = _attr_int(self._root_attr("batch_size"), 1), _attr_int(self._root_attr("batch_row"), 0)
        if batch_size < 1 or not 0 <= batch_row < batch_size:
            raise self._fail("/ attributes 'batch_size', 'batch_row'", f"row {batch_row} of a batch of {batch_size} is not a request of that batch")
        meta = CaptureMeta(
            seed=_attr_int(self._root_attr("seed"), 0), batch_size=batch_size, batch_row=batch_row, provenance=provenance, **texts
        )
        return meta, _attr_int(self._root_attr(cf.ATTR_COMPLETE), 0) == 1

    def _read_table(self, path: str, dtype: np.dtype, required: bool) -> np.ndarray:
        """One table's rows (a finished writer's, or an unfinished one's committed rows) in the format's dtype."""
        try:
            return self._table_rows(path, dtype, required)
        except UnsafeObject as exc:
            raise self._fail(exc.problem.location, exc.problem.problem) from None
        except HDF5_ERRORS as exc:
            raise self._fail(path, f"cannot be read ({describe_error(exc)})") from None

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
        layout_problem = _field_problem(ds.dtype, dtype)
        if layout_problem is not None:
            raise self._fail(path, layout_problem)
        committed = _attr_int(read_attribute(ds.id, path, cf.ATTR_COMMITTED_ROWS, self._budget), ds.shape[0])
        rows = ds.shape[0]
        selection = (slice(None),)
        if not self.complete and 0 <= committed < rows:
            # Rows past the commit may lie in chunks a killed writer never finished: never read them.
            self.dropped_rows[path] = rows - committed
            selection = (slice(0, committed),)
        raw = ChunkedReader(ds, path, self._budget, self._file_size).read(selection) if has_filters(ds) else ds[selection]
        if raw.dtype == dtype:
            return raw
        table = np.zeros(len(raw), dtype=dtype)
        for name in dtype.names:
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
    def records(self) -> list[Record]:
        return records_from_index(self.index)

    def record(self, seq: int) -> Record | None:
        """The record with this seq (a comparison or a session names records by seq); None when absent."""
        records = self.records
        if 0 <= seq < len(records) and records[seq].seq == seq:
            return records[seq]
        return next((r for r in records if r.seq == seq), None)

    @property
    def contents(self) -> CaptureContents:
        steps = np.unique(self.index["step"]).size if len(self.index) else 0
        return CaptureContents(len(self.index), int(steps), len(self.tokens), len(self.dispatch), self.complete)

    def describe(self) -> str:
        """One line for the user: what the file holds, and whether the writer finished it."""
        return self.contents.describe()

    def record_problems(self, record: Record) -> list[Problem]:
        """Everything wrong between one index row and the dataset it points at, from metadata only."""
        return self._inspect(record)[1]

    def _inspect(self, record: Record) -> tuple[h5py.h5d.DatasetID | None, list[Problem]]:
        where = f"/index row {record.seq} ({record.name})"
        try:
            ld = logical_dtype(record.dtype)
        except UnknownDtypeError as exc:
            return None, [Problem(where, str(exc))]
        try:
            ds = self._walker.dataset_id(record.path)
        except UnsafeObject as exc:
            return None, [Problem(f"{where} -> {exc.problem.location}", exc.problem.problem)]
        found = dataset_problems(ds, record.path, self._budget, self._file_size)
        found += attribute_problems(ds, record.path, self._budget)
        if found:
            return ds, found
        try:
            stored_logical = _attr_text(read_attribute(ds, record.path, cf.ATTR_LOGICAL_DTYPE, self._budget))
            shape_attr = read_attribute(ds, record.path, cf.ATTR_LOGICAL_SHAPE, self._budget) if ld.is_quantized else None
        except UnsafeObject as exc:
            return ds, [exc.problem]
        if stored_logical != record.dtype:
            found.append(
                Problem(f"{record.path} attribute 'logical_dtype'", f"is {stored_logical!r}; the index row says {record.dtype!r}")
            )
        stored = ds.dtype
        if stored != ld.storage:
            found.append(Problem(record.path, f"stored as {stored}; logical {record.dtype} is stored as {ld.storage}"))
        shape = tuple(ds.shape or ())
        if ld.is_quantized:
            found += _quantized_problems(shape, record, ld.ggml_type or "", shape_attr)
        elif shape != record.shape:
            found.append(Problem(record.path, f"has shape {shape}; the index row says {record.shape}"))
        return ds, found

    def _checked_dataset(self, record: Record) -> h5py.Dataset:
        ds, found = self._inspect(record)
        if found or ds is None:
            first = found[0] if found else Problem(record.path, "cannot be opened")
            raise self._fail(first.location, first.problem)
        return h5py.Dataset(ds)

    def chunked_reader(self, record: Record, dataset: h5py.Dataset) -> ChunkedReader | None:
        """The bounded chunk decoder of a record's filtered dataset; None when libhdf5 reads it as stored."""
        if not has_filters(dataset):
            return None
        return ChunkedReader(dataset, record.path, self._budget, self._file_size)

    def read_bits(self, record: Record, selection: tuple[slice | int, ...] | None = None) -> np.ndarray:
        """The stored bits of a tensor (uint16 for bfloat16, raw bytes for quantized blocks)."""
        ds = self._checked_dataset(record)
        try:
            chunked = self.chunked_reader(record, ds)
            if chunked is not None:
                return chunked.read(selection)
            return ds[()] if selection is None else ds[selection]
        except UnsafeObject as exc:
            raise self._fail(exc.problem.location, exc.problem.problem) from None
        except (*HDF5_ERRORS, IndexError) as exc:
            raise self._fail(record.path, f"data cannot be read ({describe_error(exc)})") from None

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


def _field_problem(stored: np.dtype, expected: np.dtype) -> str | None:
    """Why a stored compound cannot stand for the format's table, or None when every field fits."""
    missing = [n for n in expected.names if n not in stored.names and n not in cf.INDEX_OPTIONAL_FIELDS]
    if missing:
        return f"lacks field(s) {', '.join(missing)}"
    for name in (n for n in expected.names if n in stored.names):
        have, want = stored[name], expected[name]
        if have.shape != want.shape:
            return f"field {name!r} has shape {have.shape}; the format's is {want.shape}"
        have_kind, want_kind = have.base.kind, want.base.kind
        if want_kind == "S":
            if have_kind != "S" or have.base.itemsize > want.base.itemsize:
                return f"field {name!r} is {have.base}; the format's is a fixed-length string of {want.base.itemsize} bytes"
        elif have_kind not in "iu" or have.base.itemsize > want.base.itemsize:
            return f"field {name!r} is {have.base}; the format's is {want.base}"
    return None


def index_problems(index: np.ndarray) -> tuple[list[Problem], np.ndarray]:
    """Row-level problems of an index table that need no other object, in one vectorised pass.

    Returns the problems (at most 20 listed per kind) and a mask of the rows that have any.
    """
    found: list[Problem] = []
    known = np.array([name.encode() for name in LOGICAL_DTYPES])
    checks = (
        (index["seq"] != np.arange(len(index)), "seq is not the row's position (rows are in execution order)"),
        ((index["ndim"] < 0) | (index["ndim"] > cf.MAX_NDIM), f"ndim is outside 0..{cf.MAX_NDIM}"),
        ((index["shape"] < 0).any(axis=1), "shape has a negative dimension"),
        (~np.isin(index["dtype"], known), "logical dtype is not one the format knows"),
        (index["path"] == b"", "tensor path is empty"),
        (index["step"] < 0, "step is negative"),
        (index["layer"] < -1, "layer is below -1"),
        (index["occurrence"] < 0, "occurrence is negative"),
        (index["position"] < -1, "position is below -1 (-1: not recorded)"),
    )
    bad_rows = np.zeros(len(index), dtype=bool)
    for bad, what in checks:
        bad_rows |= bad
        rows = np.flatnonzero(bad)
        for row in rows[:20]:
            name = cf.decode_field(index["name"][row])
            detail = f" ({cf.decode_field(index['dtype'][row])!r})" if "dtype" in what else ""
            found.append(Problem(f"/index row {int(row)} ({name})", what + detail))
        if len(rows) > 20:
            found.append(Problem("/index", f"{len(rows) - 20} more rows where {what}"))
    return found, bad_rows


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
    try:
        file = h5py.File(path, "r", locking=False)
    except OSError as exc:
        raise CaptureError(path, "file", f"not a readable HDF5 file ({exc})") from None
    try:
        return Capture(path, file, memory_budget=memory_budget)
    except CaptureError:
        file.close()
        raise
    except Exception as exc:  # noqa: BLE001  (libhdf5 raises many types on a bad file; each is a finding)
        file.close()
        raise CaptureError(path, "file", f"unreadable structure ({describe_error(exc)})") from None


class RecordReader:
    """One record's dataset, checked once, then read slice by slice into the caller's arrays.

    A streaming comparison reads a large record in dozens of slices. `Capture.read_bits` checks
    the dataset's metadata on every call (about what copying a few MiB from the page cache
    costs) and returns a fresh array (whose page faults cost more than the copy); this does
    neither. Quantized records are read with `Capture.read_bits`: their stored shape is not
    the record's.
    """

    def __init__(self, capture: Capture, record: Record) -> None:
        self._capture = capture
        self._record = record
        self._dataset = capture._checked_dataset(record)
        self._chunked = capture.chunked_reader(record, self._dataset)

    def read_into(self, out: np.ndarray, selection: tuple[slice | int, ...] | None = None) -> np.ndarray:
        """Stored bits of the record, or of `selection`, into `out` (C-contiguous, the
        selection's shape, the stored dtype), which is returned."""
        try:
            if self._chunked is not None:
                out[...] = self._chunked.read(selection)
            else:
                self._dataset.read_direct(out, selection)
        except UnsafeObject as exc:
            raise self._capture._fail(exc.problem.location, exc.problem.problem) from None
        except (*HDF5_ERRORS, IndexError) as exc:
            raise self._capture._fail(self._record.path, f"data cannot be read ({describe_error(exc)})") from None
        return out


def stored_span(capture: Capture, record: Record) -> tuple[int, int] | None:
    """(file offset, bytes) of a record's stored data when it is one contiguous run of the file,
    from metadata only; None for chunked storage or a record that fails its checks (its read
    reports that). For read-ahead: telling the kernel which bytes come next."""
    try:
        ds = capture._checked_dataset(record)
        offset = ds.id.get_offset()
        return None if offset is None else (int(offset), int(ds.id.get_storage_size()))
    except (CaptureError, OSError, ValueError, TypeError):
        return None
