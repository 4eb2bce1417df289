"""Lazy capture reader.

The index, dispatch and token tables are each one read; tensors are read on demand, whole or
as a slice. Files come from other people's engines, so the file is opened read-only with
locking off (never blocking the engine that writes it) and every problem surfaces as a
`CaptureError` naming the file, the place and what is wrong.
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

from sessions import capture_format as cf
from sessions.capture_meta import CaptureMeta
from sessions.dtypes import UnknownDtypeError, as_values, logical_dtype


class CaptureError(Exception):
    """A capture that cannot be used as asked, with where and why."""

    def __init__(self, path: str | Path, location: str, problem: str) -> None:
        self.path = str(path)
        self.location = location
        self.problem = problem
        super().__init__(f"{self.path}: {location}: {problem}")


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
    )


def _attr_text(value: Any) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        return cf.decode_field(value)
    if isinstance(value, str):
        return value
    return str(value)


class Capture:
    """An open capture. Use `open_capture`; close it (or use `with`) when done."""

    def __init__(self, path: Path, file: h5py.File) -> None:
        self.path = path
        self._file = file
        self.meta, self.complete = self._read_root()
        self.index = self._read_table(cf.INDEX_PATH, cf.INDEX_DTYPE, required=True)
        self.dispatch = self._read_table(cf.DISPATCH_PATH, cf.DISPATCH_DTYPE, required=False)
        self.tokens = self._read_table(cf.TOKENS_PATH, cf.TOKENS_DTYPE, required=False)

    def _fail(self, location: str, problem: str) -> CaptureError:
        return CaptureError(self.path, location, problem)

    def _read_root(self) -> tuple[CaptureMeta, bool]:
        attrs = self._file.attrs
        fmt = _attr_text(attrs.get(cf.ATTR_FORMAT, b""))
        if fmt != cf.FORMAT_NAME:
            raise self._fail("/ attribute 'format'", f"not a Parity X-ray capture (format is {fmt!r})")
        version = attrs.get(cf.ATTR_VERSION)
        if version is None or int(version) != cf.FORMAT_VERSION:
            raise self._fail(
                "/ attribute 'format_version'",
                f"version {version!r} is not supported; this reader reads version {cf.FORMAT_VERSION}",
            )
        texts = {name: _attr_text(attrs.get(name, b"")) for name in cf.STRING_ATTRS}
        raw_provenance = attrs.get(cf.ATTR_PROVENANCE)
        provenance: dict[str, Any] = {}
        if raw_provenance is not None:
            try:
                provenance = json.loads(np.asarray(raw_provenance, dtype=np.uint8).tobytes().decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise self._fail("/ attribute 'provenance_json'", f"not UTF-8 JSON ({exc})") from None
        meta = CaptureMeta(seed=int(attrs.get("seed", 0)), provenance=provenance, **texts)
        return meta, int(attrs.get(cf.ATTR_COMPLETE, 0)) == 1

    def _read_table(self, path: str, dtype: np.dtype, required: bool) -> np.ndarray:
        obj = self._file.get(path, getlink=True)
        if obj is None:
            if required:
                raise self._fail(path, "missing (every capture has an index table)")
            return np.zeros(0, dtype=dtype)
        if not isinstance(obj, h5py.HardLink):
            raise self._fail(path, f"is a {type(obj).__name__}; only hard links are followed")
        ds = self._file[path]
        if not isinstance(ds, h5py.Dataset) or ds.dtype.names is None:
            raise self._fail(path, "is not a compound table")
        missing = [n for n in dtype.names if n not in ds.dtype.names]
        if missing:
            raise self._fail(path, f"lacks field(s) {', '.join(missing)}")
        return ds[()]

    @cached_property
    def records(self) -> list[Record]:
        return [record_from_row(row) for row in self.index]

    def read_bits(self, record: Record, selection: tuple[slice | int, ...] | None = None) -> np.ndarray:
        """The stored bits of a tensor (uint16 for bfloat16, raw bytes for quantized blocks)."""
        ds = self._file.get(record.path)
        if not isinstance(ds, h5py.Dataset):
            raise self._fail(record.path, f"tensor of record {record.seq} ({record.name}) is missing")
        try:
            ld = logical_dtype(record.dtype)
        except UnknownDtypeError as exc:
            raise self._fail(record.path, str(exc)) from None
        if ds.dtype != ld.storage:
            raise self._fail(record.path, f"stored as {ds.dtype}; logical {record.dtype} is stored as {ld.storage}")
        return ds[()] if selection is None else ds[selection]

    def read_values(self, record: Record, selection: tuple[slice | int, ...] | None = None) -> np.ndarray:
        """A tensor's values for display: bfloat16 through ml_dtypes, quantized blocks decoded."""
        ld = logical_dtype(record.dtype)
        if ld.is_quantized:
            return as_values(self.read_bits(record), record.dtype).reshape(record.shape)[selection or ()]
        return as_values(self.read_bits(record, selection), record.dtype)

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


def open_capture(path: str | Path) -> Capture:
    """Open a capture read-only without taking the HDF5 file lock."""
    path = Path(path)
    if not path.exists():
        raise CaptureError(path, "file", "does not exist")
    try:
        file = h5py.File(path, "r", locking=False)
    except OSError as exc:
        raise CaptureError(path, "file", f"not a readable HDF5 file ({exc})") from None
    try:
        return Capture(path, file)
    except CaptureError:
        file.close()
        raise
    except Exception as exc:
        file.close()
        raise CaptureError(path, "file", f"unreadable structure ({type(exc).__name__}: {exc})") from None
