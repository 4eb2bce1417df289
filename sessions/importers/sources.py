"""Where imported arrays come from: a safetensors file, an .npz, or a directory of .npy / .bin.

Each source pairs manifest entries with arrays and checks them against each other; a problem
names the source file or the manifest entry it comes from. Arrays keep their bits: typed
arrays are stored as they are (or reinterpreted as a same-width declared dtype), raw `.bin`
bytes are read as the declared little-endian dtype, quantized ones as GGML blocks.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sessions.bits.dtypes import (
    UnknownDtypeError,
    logical_dtype,
    logical_name_of,
    quantized_nbytes,
)
from sessions.capture.reader import CaptureError
from sessions.importers.manifest import Entry, Manifest, default_manifest

MAX_IMPORT_BYTES = 2 * 1024**3
"""The same per-tensor budget a capture reader enforces."""


@dataclass(frozen=True)
class ImportedArray:
    entry: Entry
    bits: np.ndarray
    dtype: str
    logical_shape: tuple[int, ...] | None
    """Set for quantized blocks (their stored bytes have another shape)."""


def _typed(entry: Entry, array: np.ndarray, where: Path, fail_at: str) -> ImportedArray:
    """A typed array checked against the entry's declared dtype and shape."""

    def fail(problem: str) -> CaptureError:
        return CaptureError(where, fail_at, problem)

    try:
        found = logical_name_of(array)
    except UnknownDtypeError:
        raise fail(f"array dtype {array.dtype} has no capture dtype; declare a same-width 'dtype' in the manifest") from None
    logical = entry.dtype or found
    ld = logical_dtype(logical)
    if ld.is_quantized:
        if array.dtype != np.uint8:
            raise fail(f"quantized {logical} must come as uint8 bytes, not {array.dtype}")
        return _blocks(entry, array.tobytes(), logical, where, fail_at)
    if ld.storage.itemsize != array.dtype.itemsize:
        raise fail(f"declared dtype {logical} is {ld.storage.itemsize} bytes wide, the array's {array.dtype} is {array.dtype.itemsize}")
    if entry.shape is not None and tuple(array.shape) != entry.shape:
        raise fail(f"declared shape {list(entry.shape)} but the array has shape {list(array.shape)}")
    return ImportedArray(entry, np.ascontiguousarray(array).view(ld.storage), logical, None)


def _blocks(entry: Entry, raw: bytes, logical: str, where: Path, fail_at: str) -> ImportedArray:
    if entry.shape is None:
        raise CaptureError(where, fail_at, f"quantized {logical} needs its logical 'shape' in the manifest")
    ld = logical_dtype(logical)
    try:
        expected = quantized_nbytes(str(ld.ggml_type), entry.shape)
    except ValueError as exc:
        raise CaptureError(where, fail_at, str(exc)) from None
    if len(raw) != expected:
        raise CaptureError(where, fail_at, f"{logical} of shape {list(entry.shape)} takes {expected} bytes, the data has {len(raw)}")
    rows = int(np.prod(entry.shape[:-1], dtype=np.int64)) if len(entry.shape) > 1 else 1
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(rows, expected // max(rows, 1))
    return ImportedArray(entry, blocks, logical, entry.shape)


def _raw(entry: Entry, path: Path, manifest: Path) -> ImportedArray:
    """A `.bin` file: exactly the declared dtype x shape, little-endian."""
    where = entry.label()
    if entry.dtype is None or entry.shape is None:
        raise CaptureError(manifest, where, f"raw file {entry.file!r} needs 'dtype' and 'shape'")
    size = path.stat().st_size
    if size > MAX_IMPORT_BYTES:
        raise CaptureError(manifest, where, f"{entry.file!r} is {size} bytes, over the {MAX_IMPORT_BYTES}-byte budget")
    ld = logical_dtype(entry.dtype)
    raw = path.read_bytes()
    if ld.is_quantized:
        return _blocks(entry, raw, entry.dtype, manifest, where)
    count = int(np.prod(entry.shape, dtype=np.int64))
    expected = count * ld.storage.itemsize
    if len(raw) != expected:
        raise CaptureError(
            manifest, where,
            f"shape {list(entry.shape)} of {entry.dtype} needs {expected} bytes, {entry.file!r} holds {len(raw)}",
        )
    bits = np.frombuffer(raw, dtype=ld.storage.newbyteorder("<")).astype(ld.storage, copy=False).reshape(entry.shape)
    return ImportedArray(entry, bits, entry.dtype, None)


def from_directory(manifest: Manifest) -> Iterator[ImportedArray]:
    """The entries of a directory manifest, each read from its `.npy` or `.bin` file."""
    base = manifest.path.parent
    for entry in manifest.entries:
        path = base / str(entry.file)
        if not path.is_file():
            raise CaptureError(manifest.path, entry.label(), f"file {entry.file!r} does not exist in {base}")
        if path.suffix == ".npy":
            try:
                array = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as exc:
                raise CaptureError(manifest.path, entry.label(), f"{entry.file!r} is not a readable .npy file ({exc})") from None
            yield _typed(entry, array, manifest.path, entry.label())
        elif path.suffix == ".bin":
            yield _raw(entry, path, manifest.path)
        else:
            raise CaptureError(manifest.path, entry.label(), f"file {entry.file!r} is neither .npy nor .bin")


def _pick(entries: list[Entry], available: list[str], source: Path, manifest: Path) -> None:
    missing = [e for e in entries if e.source_key not in available]
    if missing:
        entry = missing[0]
        raise CaptureError(manifest, entry.label(), f"{source.name} has no array {entry.source_key!r} (it has {len(available)}: {', '.join(available[:8])}{', ...' if len(available) > 8 else ''})")


def from_npz(path: Path, manifest: Manifest | None) -> tuple[Manifest, Iterator[ImportedArray]]:
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise CaptureError(path, "file", f"not a readable .npz archive ({exc})") from None
    names = list(archive.files)
    manifest = manifest or default_manifest(names, path)
    _pick(manifest.entries, names, path, manifest.path)

    def arrays() -> Iterator[ImportedArray]:
        with archive:
            for entry in manifest.entries:
                try:
                    array = archive[entry.source_key]
                except (ValueError, OSError, zipfile.BadZipFile) as exc:
                    raise CaptureError(path, entry.source_key, f"unreadable array ({exc})") from None
                yield _typed(entry, array, manifest.path, entry.label())

    return manifest, arrays()


def from_safetensors(path: Path, manifest: Manifest | None) -> tuple[Manifest, Iterator[ImportedArray]]:
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(path), framework="numpy")
        names = list(handle.keys())
    except (SafetensorError, OSError, ValueError) as exc:
        raise CaptureError(path, "file", f"not a readable safetensors file ({exc})") from None
    manifest = manifest or default_manifest(names, path)
    _pick(manifest.entries, names, path, manifest.path)

    def arrays() -> Iterator[ImportedArray]:
        for entry in manifest.entries:
            try:
                array = handle.get_tensor(entry.source_key)
            except (SafetensorError, TypeError, ValueError) as exc:
                raise CaptureError(path, entry.source_key, f"unreadable tensor ({exc})") from None
            yield _typed(entry, array, manifest.path, entry.label())

    return manifest, arrays()
