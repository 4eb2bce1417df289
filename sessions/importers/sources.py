"""Where imported arrays come from: a safetensors file, an .npz, or a directory of .npy / .bin.

Each source pairs manifest entries with arrays and checks them against each other; a problem
names the source file or the manifest entry it comes from. Arrays keep their bits: typed
arrays are stored as they are (or reinterpreted as a same-width declared dtype), raw `.bin`
bytes are read as the declared little-endian dtype, quantized ones as GGML blocks.

The files are someone else's: every array's size is known before it is read (a .npy header, a
manifest's shape, a safetensors header) and held to one budget, its dimensions to the format's,
and a file must be a regular file inside the dump folder (a symlink out of it is refused, as a
`..` in the manifest is).
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from sessions.bits.dtypes import (
    UnknownDtypeError,
    logical_dtype,
    logical_name_of,
    quantized_nbytes,
)
from sessions.capture import format as cf
from sessions.capture.reader import CaptureError
from sessions.importers.manifest import Entry, Manifest, default_manifest, infer_layer
from sessions.side_file import open_regular_file

MAX_IMPORT_BYTES = 2 * 1024**3
"""The same per-tensor budget a capture reader enforces."""

SAFETENSORS_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8,
}
"""The safetensors dtypes that have a capture dtype (others, such as F8_E4M3, do not; numpy may
not even have a type for them), with their widths for the budget."""
_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
"""The .npy versions numpy writes for plain arrays (3.0 only adds non-Latin-1 field names)."""


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

    logical = entry.dtype
    if logical is None:
        try:
            logical = logical_name_of(array)
        except UnknownDtypeError:
            raise fail(f"array dtype {array.dtype} has no capture dtype; declare a same-width 'dtype' in the manifest") from None
    ld = logical_dtype(logical)
    if ld.is_quantized:
        if array.dtype != np.uint8:
            raise fail(f"quantized {logical} must come as uint8 bytes, not {array.dtype}")
        return _blocks(entry, array.tobytes(), logical, where, fail_at)
    if ld.storage.itemsize != array.dtype.itemsize:
        raise fail(f"declared dtype {logical} is {ld.storage.itemsize} bytes wide, the array's {array.dtype} is {array.dtype.itemsize}")
    if entry.shape is not None and tuple(array.shape) != entry.shape:
        raise fail(f"declared shape {list(entry.shape)} but the array has shape {list(array.shape)}")
    if array.ndim > cf.MAX_NDIM:
        raise fail(f"the array has {array.ndim} dimensions; the capture format allows at most {cf.MAX_NDIM}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))  # a big-endian array: its values, in the capture's byte order
    # np.asarray, not ascontiguousarray, which makes a 0-d scalar a 1-element array
    return ImportedArray(entry, np.asarray(array, order="C").view(ld.storage), logical, None)


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
    rows = math.prod(entry.shape[:-1])
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(rows, expected // max(rows, 1))
    return ImportedArray(entry, blocks, logical, entry.shape)


def _over_budget(nbytes: int, what: str) -> str | None:
    return f"{what} is {nbytes} bytes, over the {MAX_IMPORT_BYTES}-byte budget" if nbytes > MAX_IMPORT_BYTES else None


def _raw(entry: Entry, file: BinaryIO, manifest: Path) -> ImportedArray:
    """A `.bin` file: exactly the declared dtype x shape, little-endian."""
    where = entry.label()
    if entry.dtype is None or entry.shape is None:
        raise CaptureError(manifest, where, f"raw file {entry.file!r} needs 'dtype' and 'shape'")
    problem = _over_budget(os.fstat(file.fileno()).st_size, repr(entry.file))
    if problem is not None:
        raise CaptureError(manifest, where, problem)
    ld = logical_dtype(entry.dtype)
    raw = file.read(MAX_IMPORT_BYTES + 1)
    if ld.is_quantized:
        return _blocks(entry, raw, entry.dtype, manifest, where)
    expected = math.prod(entry.shape) * ld.storage.itemsize
    if len(raw) != expected:
        raise CaptureError(
            manifest, where,
            f"shape {list(entry.shape)} of {entry.dtype} needs {expected} bytes, {entry.file!r} holds {len(raw)}",
        )
    bits = np.frombuffer(raw, dtype=ld.storage.newbyteorder("<")).astype(ld.storage, copy=False).reshape(entry.shape)
    return ImportedArray(entry, bits, entry.dtype, None)


def _npy(file: BinaryIO, fail: Callable[[str], CaptureError]) -> np.ndarray:
    """The array of a .npy stream, its header checked first: a few bytes may declare any shape,
    and numpy allocates the whole declared array before it reads a byte of data."""
    try:
        version = np.lib.format.read_magic(file)
        if version not in _NPY_HEADER_READERS:
            raise fail(f"is .npy format version {version[0]}.{version[1]}; the importer reads 1.0 and 2.0")
        shape, _, dtype = _NPY_HEADER_READERS[version](file)
        if len(shape) > cf.MAX_NDIM:
            raise fail(f"declares {len(shape)} dimensions; the capture format allows at most {cf.MAX_NDIM}")
        problem = _over_budget(math.prod(shape) * dtype.itemsize, f"the declared {dtype} array of shape {list(shape)}")
        if problem is not None:
            raise fail(problem)
        file.seek(0)
        return np.lib.format.read_array(file, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise fail(f"is not a readable .npy array ({exc})") from None


def _inside(path: Path, base: Path, manifest: Path, where: str) -> bool:
    """Whether `path`, its symlinks followed, is still in the folder `base`; CaptureError (at
    `where` of `manifest`) for links that cannot be followed, such as a loop."""
    try:
        return path.resolve().is_relative_to(base.resolve())
    except (RuntimeError, OSError) as exc:  # a symlink loop raises RuntimeError before Python 3.13
        raise CaptureError(manifest, where, f"file {path.name!r} cannot be followed to a file ({exc})") from None


def _from_file(entry: Entry, path: Path, manifest: Path) -> ImportedArray:
    where = entry.label()
    if path.suffix not in (".npy", ".bin"):
        raise CaptureError(manifest, where, f"file {entry.file!r} is neither .npy nor .bin")
    try:
        file = open_regular_file(path)
    except FileNotFoundError:
        raise CaptureError(manifest, where, f"file {entry.file!r} does not exist in {path.parent}") from None
    except OSError as exc:
        raise CaptureError(manifest, where, f"file {entry.file!r} cannot be read ({exc.strerror or exc})") from None
    with file:
        if path.suffix == ".bin":
            return _raw(entry, file, manifest)
        array = _npy(file, lambda problem: CaptureError(manifest, where, f"{entry.file!r} {problem}"))
    return _typed(entry, array, manifest, where)


def from_directory(manifest: Manifest) -> Iterator[ImportedArray]:
    """The entries of a directory manifest, each read from its `.npy` or `.bin` file."""
    base = manifest.path.parent
    for entry in manifest.entries:
        path = base / str(entry.file)
        if not _inside(path, base, manifest.path, entry.label()):
            raise CaptureError(manifest.path, entry.label(), f"file {entry.file!r} resolves to {path.resolve()}, outside {base}; a symlink may not lead out of the dump folder")
        yield _from_file(entry, path, manifest.path)


def _pick(entries: list[Entry], available: list[str], source: Path, manifest: Path) -> None:
    missing = [e for e in entries if e.source_key not in available]
    if missing:
        entry = missing[0]
        raise CaptureError(manifest, entry.label(), f"{source.name} has no array {entry.source_key!r} (it has {len(available)}: {', '.join(available[:8])}{', ...' if len(available) > 8 else ''})")


def _members(archive: zipfile.ZipFile, path: Path) -> dict[str, str]:
    """Array name -> member name, as `numpy.load` names an .npz's arrays (`a.npy` is `a`). Two
    members of one name (a zip may hold them) are refused: which one an engine meant is unknown."""
    members: dict[str, str] = {}
    for name in archive.namelist():
        array = name.removesuffix(".npy")
        if array in members:
            raise CaptureError(path, f"member {name!r}", f"the archive holds two arrays named {array!r}")
        members[array] = name
    return members


def from_npz(path: Path, manifest: Manifest | None) -> tuple[Manifest, Iterator[ImportedArray]]:
    try:
        archive = zipfile.ZipFile(path)
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise CaptureError(path, "file", f"not a readable .npz archive ({exc})") from None
    try:
        members = _members(archive, path)
    except CaptureError:
        archive.close()
        raise
    manifest = manifest or default_manifest(list(members), path)
    _pick(manifest.entries, list(members), path, manifest.path)

    def arrays() -> Iterator[ImportedArray]:
        with archive:
            for entry in manifest.entries:
                key = entry.source_key
                try:
                    member = archive.open(members[key])
                except (RuntimeError, NotImplementedError, zipfile.BadZipFile, OSError, ValueError) as exc:  # encrypted, an unknown compression
                    raise CaptureError(path, key, f"cannot be read from the archive ({exc})") from None
                with member:
                    array = _npy(member, lambda problem, key=key: CaptureError(path, key, problem))
                yield _typed(entry, array, manifest.path, entry.label())

    return manifest, arrays()


def _safetensors_problem(dtype: str, shape: list[int]) -> str | None:
    """Why a tensor, as its header declares it, cannot be imported (checked before its bytes are read)."""
    if dtype not in SAFETENSORS_ITEMSIZE:
        return f"dtype {dtype} has no capture dtype (importable: {', '.join(SAFETENSORS_ITEMSIZE)})"
    if len(shape) > cf.MAX_NDIM:
        return f"has {len(shape)} dimensions; the capture format allows at most {cf.MAX_NDIM}"
    return _over_budget(math.prod(shape) * SAFETENSORS_ITEMSIZE[dtype], f"the {dtype} tensor of shape {shape}")


def from_safetensors(path: Path, manifest: Manifest | None) -> tuple[Manifest, Iterator[ImportedArray]]:
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(path), framework="numpy")
        names = list(handle.keys())
    except (SafetensorError, OSError, ValueError) as exc:
        raise CaptureError(path, "file", f"not a readable safetensors file ({exc})") from None
    # safetensors stores tensors sorted by name, whatever order they were dumped in, so
    # `attn_norm-10` comes before `attn_norm-2`: without a manifest, layer by layer is the
    # nearest to execution order (records of no layer, such as logits, after the layers).
    layer_order = sorted(names, key=lambda name: (infer_layer(name) < 0, infer_layer(name)))
    manifest = manifest or default_manifest(layer_order, path)
    _pick(manifest.entries, names, path, manifest.path)

    def arrays() -> Iterator[ImportedArray]:
        for entry in manifest.entries:
            key = entry.source_key
            try:
                header = handle.get_slice(key)
                problem = _safetensors_problem(header.get_dtype(), header.get_shape())
                if problem is not None:
                    raise CaptureError(path, key, problem)
                array = handle.get_tensor(key)
            except (SafetensorError, TypeError, ValueError) as exc:
                raise CaptureError(path, key, f"unreadable tensor ({exc})") from None
            yield _typed(entry, array, manifest.path, entry.label())

    return manifest, arrays()
