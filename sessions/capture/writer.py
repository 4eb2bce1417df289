"""Streaming capture writer whose file stays readable whatever instant its process is killed.

Engines call it record by record while they run; `end_step` makes the step's records visible.
libhdf5 flushes dirty metadata in address order with the superblock (and its end-of-allocation
mark) last, so a process killed mid-flush leaves some structures updated in place and others
not, and anything that points at space allocated since the last flush reads as past the end of
the file. A torn group that holds finished steps' tensors then hides all of them (measured:
about 1 kill in 100 left an unopenable file). So the writer never modifies in place anything a
reader needs for finished steps, except with one small write that is valid whether or not it
landed (docs/capture-format.md, "Writing"):

- every group is filled once, before anything under it is committed: `/tensors` is created
  with all its blocks, a block with all its (empty) step groups, a step group receives only
  its own step's tensors;
- table rows are appended past `committed_rows`, which readers of an unfinished file never
  read, and are committed by rewriting that one attribute after a flush; `/index` first, so
  dispatch rows and tokens never point past the records shown;
- `complete` exists from the start as 0 and turns 1 by one in-place write at `close`;
- the file is created under a temporary name and renamed once its first step is committed
  (with `complete_only`, once it is complete: whole or not at all), so a run stopped before
  its first step leaves `path` as it was (with --force, the capture that was there).

Before each write the writer asks for room (sessions.file_room): libhdf5, once one of its
writes has failed for want of room, can neither flush nor close the file.

Tensors go into packs by default (docs/capture-format.md, "Packs"): small tensors are copied
into a buffer that becomes one dataset of a step group when it fills or the step ends, and a
large tensor becomes a pack of its own, written from the caller's array. A dataset per tensor
cost 290 us to write and 65 us to check, whatever its size; a pack costs that per few MiB. A
pack is written whole, once, into the step group being filled, so it is as kill-safe as the
per-tensor datasets it replaces (`layout="datasets"` still writes those).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import functools
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Concatenate, ParamSpec, TypeVar

import h5py
import numpy as np

from sessions.atomic_write import fsync_directory, fsync_file
from sessions.bits.dtypes import logical_dtype, logical_name_of, to_storage
from sessions.capture import format as cf
from sessions.capture.abandoned_writes import held_partial, remove_abandoned_writes
from sessions.capture.hdf5_safety import MAX_ATTRIBUTE_BYTES
from sessions.capture.meta import CaptureMeta
from sessions.capture.pack_layout import stored_nbytes
from sessions.file_room import FileUnwritable, room_for

COMPRESSIONS = (None, "gzip", "lzf")
LAYOUTS = ("packed", "datasets")
"""Tensors as byte ranges of packs (the default), or each in a dataset of its own (the layout before packs)."""
PACK_BYTES = 16 * 1024**2
"""Small tensors gathered into one pack: large enough that a pack's own cost (creating,
flushing and checking one dataset) is small next to writing its bytes, small enough to buffer."""
OWN_PACK_BYTES = 4 * 1024**2
"""A tensor of at least this many bytes is a pack of its own, written without a copy."""
PACK_CHUNK_BYTES = 1024**2
"""Chunk of a compressed pack: the unit a reader decodes."""
ROOM_MARGIN_BYTES = 2 * 1024**2
"""Room a write must leave (on the device, and under the process's file size limit) for what
libhdf5 writes at the next flush and at close: the tables' chunks (1,024 rows each, 0.7 MB for
the three) and their metadata. A write libhdf5 itself finds no room for leaves it unable to
flush or close the file (its later errors read "slist already enabled"), and the interpreter's
exit then crashed in its teardown (SIGSEGV), so the writer refuses first, while the file can
still be closed with its committed steps readable."""
SKELETON_BYTES = 64 * 1024
"""About what an empty capture (root attributes, groups, empty tables) takes: 31 KB."""
TABLES: tuple[tuple[str, np.dtype], ...] = (
    (cf.INDEX_PATH, cf.INDEX_DTYPE),
    (cf.DISPATCH_PATH, cf.DISPATCH_DTYPE),
    (cf.TOKENS_PATH, cf.TOKENS_DTYPE),
)


def _unwritable(path: Path, exc: OSError | RuntimeError, failed: str = "cannot be written") -> FileUnwritable:
    """`exc` as a FileUnwritable; h5py raises RuntimeError when a flush fails."""
    if isinstance(exc, FileUnwritable):
        return exc
    number = exc.errno if isinstance(exc, OSError) else _errno_of(exc)
    words = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)).strip()
    reason = os.strerror(number) if number else (words.splitlines()[0] if words else type(exc).__name__)
    return FileUnwritable(number, f"{failed} ({reason})", str(path))


def _errno_of(exc: RuntimeError) -> int | None:
    """The errno libhdf5 names in a failed flush's words ("errno = 28"), if any."""
    found = re.search(r"errno = (\d+)", str(exc))
    return int(found.group(1)) if found else None


_Args = ParamSpec("_Args")
_Result = TypeVar("_Result")


def _writes(method: Callable[Concatenate["CaptureWriter", _Args], _Result]) -> Callable[Concatenate["CaptureWriter", _Args], _Result]:
    """A writer method whose libhdf5 failures (a full disk, a file gone read-only) are `FileUnwritable`."""

    @functools.wraps(method)
    def writing(writer: "CaptureWriter", *args: _Args.args, **kwargs: _Args.kwargs) -> _Result:
        try:
            return method(writer, *args, **kwargs)
        except (OSError, RuntimeError) as exc:
            failure = writer._failed(exc)
        # Raised here, past the handler, so libhdf5's error and the frames of its traceback go now:
        # a dataset a frame held, freed after its file was closed, crashed libhdf5 (SIGSEGV).
        raise failure

    return writing


def _set_scalar(obj_id: h5py.h5o.ObjectID, name: str, value: np.ndarray) -> None:
    """Overwrite an existing scalar attribute in place (h5py's `attrs.create` deletes and re-adds
    it, moving object header messages around: several writes, tearable by a kill)."""
    h5py.h5a.open(obj_id, name.encode()).write(value)


_TEXT_TYPES: dict[int, h5py.h5t.TypeID] = {}


def _add_text_attrs(ds: h5py.Dataset, attrs: Mapping[str, list[bytes] | bytes]) -> None:
    """New fixed-length UTF-8 attributes, scalar (a tensor's own dataset) or a table (a pack's),
    through h5py's low-level calls: `attrs.create` looks for an existing attribute and rebuilds
    the type each time."""
    for name, value in attrs.items():
        texts = np.array(value)
        size = max(1, texts.dtype.itemsize)
        text_type = _TEXT_TYPES.get(size)
        if text_type is None:
            text_type = _TEXT_TYPES[size] = h5py.h5t.py_create(cf.utf8(size), logical=True)
        space = h5py.h5s.create(h5py.h5s.SCALAR) if texts.ndim == 0 else h5py.h5s.create_simple(texts.shape)
        h5py.h5a.create(ds.id, name.encode("utf-8"), text_type, space).write(texts.astype(f"S{size}"), mtype=text_type)


FILE_FORMAT = ("v108", "v108")
"""libhdf5's 1.8 file format: the earliest one refuses an attribute over 64 KiB, the prompt and
provenance of a run of about 8,000 tokens; a newer one marks a file open while it is written, so a
killed writer's would not open (docs/capture-format.md, "Writing")."""
MAX_ATTRIBUTE_NAME_BYTES = 255
"""A recorder attribute's name shares libhdf5's 64 KiB per attribute with its value: kept short."""


def _encoded_attrs(name: str, attrs: dict[str, str] | None) -> dict[str, bytes]:
    """A tensor's recorder attributes as UTF-8, each within what one attribute table may hold."""
    encoded = {key: text.encode("utf-8") for key, text in (attrs or {}).items()}
    for key, raw in encoded.items():
        if len(key.encode("utf-8")) > MAX_ATTRIBUTE_NAME_BYTES:
            raise ValueError(f"{name}: attribute name {key[:40]!r}... is over {MAX_ATTRIBUTE_NAME_BYTES} bytes")
        if len(raw) > cf.ATTRIBUTE_TABLE_BYTES:
            raise ValueError(f"{name}: attribute {key!r} is {len(raw)} bytes; an attribute holds at most {cf.ATTRIBUTE_TABLE_BYTES}")
    return encoded


_TABLE_TYPES: dict[np.dtype, h5py.h5t.TypeID] = {}


def _append_rows(ds: h5py.Dataset, rows: np.ndarray) -> None:
    """`rows` appended to a table, through h5py's low-level calls: `ds[a:] = rows` builds the
    table's compound HDF5 type again on every call, 0.5 of its 0.67 ms (three tables every step)."""
    start = ds.shape[0]
    ds.resize((start + len(rows),))
    target = ds.id.get_space()
    target.select_hyperslab((start,), (len(rows),))
    memory_type = _TABLE_TYPES.get(rows.dtype)
    if memory_type is None:
        memory_type = _TABLE_TYPES[rows.dtype] = h5py.h5t.py_create(rows.dtype)
    ds.id.write(h5py.h5s.create_simple((len(rows),)), target, rows, mtype=memory_type)


class CaptureWriter:
    def __init__(
        self, path: str | Path, meta: CaptureMeta, compression: str | None = None, layout: str = "packed", complete_only: bool = False
    ) -> None:
        """`complete_only`: `path` receives the capture only once it is complete, renamed there at
        `close`; a write that fails, or `abandon`, leaves `path` as it was (an import, a saved
        rerun: whole or not at all). Otherwise `path` holds the capture from its first committed
        step on, readable as incomplete while it grows: a recording killed or out of room keeps
        the steps it committed, and one stopped before its first step leaves `path` as it was."""
        if meta.role not in cf.ROLES:
            raise ValueError(f"role must be one of {cf.ROLES}, not {meta.role!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, not {compression!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
        self.path = Path(path)
        self._compression = compression
        self._packed = layout == "packed"
        self._buffer = np.empty(0, dtype=np.uint8)
        self._filled = 0
        self._buffer_seq: int | None = None
        """Sequence number of the first tensor in the buffer: the name of the pack it becomes."""
        self._buffer_path = b""
        self._buffer_records = 0
        self._buffer_attrs: dict[str, list[bytes]] = {}
        """Each recorder attribute of the buffered records, one text per record ('' for none): the pack's tables."""
        self._buffer_widths: dict[str, int] = {}
        """The longest text of each table so far."""
        self._texts: dict[tuple[str, str], bytes] = {}
        self.abandoned = remove_abandoned_writes(self.path)
        """Hidden files of killed writers of `path` that this one removed (sessions.capture.abandoned_writes)."""
        # A name of its own: a fixed one (".X.h5.partial") replaced whatever file had it, and
        # two writers of one path wrote into one file.
        try:
            self._lock, partial = held_partial(self.path)
        except OSError as exc:  # its words name the hidden file, which the user never asked for
            raise _unwritable(self.path, exc) from None
        self._partial = partial
        self._complete_only = complete_only
        self._published = False
        """Whether `path` holds this capture (`_publish_growing`)."""
        try:
            self._file = h5py.File(partial, "w", locking=False, libver=FILE_FORMAT)
        except BaseException as exc:
            self._unlock()
            partial.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise _unwritable(self.path, exc) from None
            raise
        self._t0 = time.perf_counter_ns()
        self._occurrences: Counter[tuple[int, str, int, str]] = Counter()
        self._calls: set[tuple[int, int]] = set()
        """(index_seq, call) of every dispatch row: a reader refuses a second row for one call."""
        self._emitted: set[tuple[int, str]] = set()
        """(step, segment) of every token row: a reader refuses a second token of one forward call."""
        self._seq = 0
        self._pending_index: list[tuple] = []
        self._pending_dispatch: list[tuple] = []
        self._pending_tokens: list[tuple] = []
        self._group = 0
        """Number of the step group the next tensor goes to (step groups that hold tensors count)."""
        self._step_group: h5py.Group | None = None
        self._failure: FileUnwritable | None = None
        """The first write that failed (`_refuse_after_failure`)."""
        try:
            self._make_room(SKELETON_BYTES)
            self._write_skeleton(meta)
        except BaseException as exc:  # the skeleton never reached `path`: nothing of it is left behind
            with contextlib.suppress(OSError, RuntimeError):  # libhdf5 out of room cannot close either: the first failure is the news
                self._file.close()
            partial.unlink(missing_ok=True)
            self._unlock()
            if isinstance(exc, FileUnwritable):
                raise
            if isinstance(exc, (OSError, RuntimeError)):
                raise _unwritable(self.path, exc, "cannot write the capture's root attributes and tables") from None
            raise

    def _write_skeleton(self, meta: CaptureMeta) -> None:
        """Root attributes and empty tables, written under a hidden name: `path` only ever holds a readable capture."""
        self._write_root_attrs(meta)
        tensors = self._file.create_group(cf.TENSORS_GROUP)
        for block in range(cf.STEP_BLOCKS):
            tensors.create_group(f"b{block:02d}")
        for path_, dtype in TABLES:
            ds = self._file.create_dataset(path_, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(1024,))
            ds.attrs.create(cf.ATTR_COMMITTED_ROWS, np.int64(0))
        self._file.flush()

    def _write_root_attrs(self, meta: CaptureMeta) -> None:
        attrs = self._file.attrs
        attrs.create(cf.ATTR_FORMAT, np.bytes_(cf.FORMAT_NAME.encode()), dtype=h5py.string_dtype("utf-8", len(cf.FORMAT_NAME)))
        attrs.create(cf.ATTR_VERSION, np.int64(cf.FORMAT_VERSION))
        created = meta.created_utc or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        texts = {name: (created if name == "created_utc" else getattr(meta, name)).encode("utf-8") for name in cf.STRING_ATTRS}
        provenance = meta.provenance_bytes()
        for name, raw in [*texts.items(), (cf.ATTR_PROVENANCE, provenance)]:
            if len(raw) > MAX_ATTRIBUTE_BYTES:  # a reader refuses it: the file would be written for nothing
                raise ValueError(f"{self.path}: its {name} is {len(raw):,} bytes, over the {MAX_ATTRIBUTE_BYTES // 1024**2} MiB an attribute of a capture holds")
        for name, raw in texts.items():
            attrs.create(name, np.bytes_(raw), dtype=h5py.string_dtype("utf-8", max(1, len(raw))))
        attrs.create("seed", np.int64(meta.seed))
        if meta.batch_size != 1:
            attrs.create("batch_size", np.int64(meta.batch_size))
            attrs.create("batch_row", np.int64(meta.batch_row))
        if meta.batch_stacked:
            attrs.create("batch_stacked", np.int64(1))
        attrs.create(cf.ATTR_PROVENANCE, np.frombuffer(provenance, dtype=np.uint8))
        attrs.create(cf.ATTR_COMPLETE, np.int8(0))

    def _open_step_group(self) -> h5py.Group:
        """This step's (empty) group; the first step of a block creates all the block's step groups."""
        block = cf.step_block(self._group)
        if self._group == 2**block - 1:
            block_group = self._file[f"{cf.TENSORS_GROUP}/b{block:02d}"]
            for group in range(self._group, 2 ** (block + 1) - 1):
                block_group.create_group(f"s{group:07d}")
        return self._file[cf.step_group_path(self._group)]

    def now_ns(self) -> int:
        """Nanoseconds since the capture started: the clock of every timestamp in the file."""
        return time.perf_counter_ns() - self._t0

    @_writes
    def add_tensor(
        self,
        name: str,
        array: np.ndarray,
        *,
        step: int,
        segment: str,
        layer: int = -1,
        dtype: str | None = None,
        logical_shape: tuple[int, ...] | None = None,
        kernel_id: str = "",
        contract_id: str = "",
        effective_contract_id: str = "",
        t_start_ns: int | None = None,
        t_end_ns: int | None = None,
        attrs: dict[str, str] | None = None,
        position: int = -1,
    ) -> int:
        """Store one tensor and queue its index row; returns its sequence number.

        `dtype` names the logical dtype when the array holds bits of another (a uint16 array
        of bfloat16 bits, raw bytes of Q8_0 blocks with `logical_shape`). `attrs` are extra
        engine-specific string attributes of the tensor (fixed-length UTF-8; an element of its
        pack's table `NAME[]`, or on its own dataset), e.g. the llama.cpp recorder's `ggml_src`
        (docs/capture-format.md, "Recorder attributes"). The array is copied or written before
        this returns, so the caller may reuse it.
        `position` is the absolute token position of the tensor's first row (-1: not recorded).
        """
        self._refuse_after_failure()
        logical = dtype or logical_name_of(array)
        ld = logical_dtype(logical)
        stored = to_storage(np.asarray(array), logical)
        shape = tuple(logical_shape) if logical_shape is not None else stored.shape
        if ld.is_quantized and logical_shape is None:
            raise ValueError(f"{name}: quantized {logical} needs its logical_shape")
        if len(shape) > cf.MAX_NDIM:
            raise ValueError(f"{name}: {len(shape)} dims; the format allows {cf.MAX_NDIM}")
        seq = self._seq
        if self._step_group is None:
            self._step_group = self._open_step_group()
        if self._packed:
            path, offset, nbytes = self._pack_tensor(seq, name, stored, logical, shape, _encoded_attrs(name, attrs))
        else:
            path, offset, nbytes = self._tensor_dataset(seq, stored, logical, shape, ld.is_quantized, _encoded_attrs(name, attrs)).encode(), -1, -1
        key = (step, segment, layer, name)
        occurrence = self._occurrences[key]
        self._occurrences[key] += 1
        end = self.now_ns() if t_end_ns is None else t_end_ns
        self._pending_index.append(
            (
                seq,
                step,
                self._encoded("segment", segment),
                layer,
                self._encoded("name", name),
                occurrence,
                logical.encode(),
                len(shape),
                shape + (0,) * (cf.MAX_NDIM - len(shape)),
                path,
                self._encoded("kernel_id", kernel_id),
                self._encoded("contract_id", contract_id),
                self._encoded("effective_contract_id", effective_contract_id),
                end if t_start_ns is None else t_start_ns,
                end,
                position,
                offset,
                nbytes,
            )
        )
        self._seq += 1
        return seq

    def _encoded(self, field: str, text: str) -> bytes:
        """An index text field's bytes, checked against its size once per distinct text (names repeat every step)."""
        raw = self._texts.get((field, text))
        if raw is None:
            raw = self._texts[(field, text)] = cf.encode_field(text, cf.INDEX_DTYPE[field], field)
        return raw

    def _tensor_dataset(
        self, seq: int, stored: np.ndarray, logical: str, shape: tuple[int, ...], quantized: bool, attrs: dict[str, bytes]
    ) -> str:
        """The tensor as a dataset of its own (the layout before packs); returns its path."""
        assert self._step_group is not None
        self._make_room(stored.nbytes)
        chunks = self._compression is not None and stored.size > 0 and stored.ndim > 0
        ds = self._step_group.create_dataset(
            f"t{seq:08d}", data=stored, compression=self._compression if chunks else None, chunks=True if chunks else None
        )
        ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(logical.encode()), dtype=cf.utf8(len(logical)))
        if quantized:
            ds.attrs.create(cf.ATTR_LOGICAL_SHAPE, np.asarray(shape, dtype=np.int64))
        _add_text_attrs(ds, attrs)
        return cf.tensor_path(seq, self._group)

    def _pack_tensor(
        self, seq: int, name: str, stored: np.ndarray, logical: str, shape: tuple[int, ...], attrs: dict[str, bytes]
    ) -> tuple[bytes, int, int]:
        """The tensor's bytes into the pack buffer, or a pack of its own; returns (pack path, offset, nbytes).

        A strided array (a recorder's view of a permuted tensor) is copied once, straight into
        the buffer in its logical order, not first made contiguous and then copied again."""
        size = stored.nbytes
        expected = stored_nbytes(logical, shape)
        if size != expected:
            raise ValueError(f"{name}: {size} bytes; {logical} of logical shape {shape} takes {expected}")
        if size >= OWN_PACK_BYTES:
            self._write_pack(seq, np.ascontiguousarray(stored).reshape(-1).view(np.uint8), {key: [text] for key, text in attrs.items()})
            return cf.pack_path(seq, self._group).encode(), 0, size
        if self._filled + size > PACK_BYTES or not self._tables_fit(attrs):
            self._flush_pack()
        if self._buffer_seq is None:
            self._buffer_seq, self._buffer_path = seq, cf.pack_path(seq, self._group).encode()
            if self._buffer.size == 0:
                self._buffer = np.empty(PACK_BYTES, dtype=np.uint8)
        offset = self._filled
        np.copyto(self._buffer[offset : offset + size].view(stored.dtype).reshape(stored.shape), stored)
        self._filled += size
        for key in attrs.keys() - self._buffer_attrs.keys():
            self._buffer_attrs[key] = [b""] * self._buffer_records
        for key, texts in self._buffer_attrs.items():
            text = attrs.get(key, b"")
            texts.append(text)
            self._buffer_widths[key] = max(self._buffer_widths.get(key, 1), len(text))
        self._buffer_records += 1
        return self._buffer_path, offset, size

    def _tables_fit(self, attrs: dict[str, bytes]) -> bool:
        """Whether the buffer's attribute tables stay within `ATTRIBUTE_TABLE_BYTES` with one more record's `attrs`."""
        rows = self._buffer_records + 1
        return all(
            rows * max(self._buffer_widths.get(key, 1), len(attrs.get(key, b""))) <= cf.ATTRIBUTE_TABLE_BYTES
            for key in self._buffer_widths.keys() | attrs.keys()
        )

    def _flush_pack(self) -> None:
        """The buffered tensors become one pack of the current step group."""
        try:
            if self._buffer_seq is not None:
                self._write_pack(self._buffer_seq, self._buffer[: self._filled], self._buffer_attrs)
        finally:
            # Also after a failed write, so `abandon` does not write the same pack again and hide why.
            self._buffer_seq, self._filled, self._buffer_records, self._buffer_attrs, self._buffer_widths = None, 0, 0, {}, {}

    def _write_pack(self, first_seq: int, raw: np.ndarray, attrs: dict[str, list[bytes]]) -> None:
        """One pack, created, written and given its records' attributes before anything under its step is committed."""
        assert self._step_group is not None
        self._make_room(raw.nbytes)
        chunked = self._compression is not None and raw.size > 0
        ds = self._step_group.create_dataset(
            f"p{first_seq:08d}",
            data=raw,
            compression=self._compression if chunked else None,
            chunks=(min(raw.size, PACK_CHUNK_BYTES),) if chunked else None,
        )
        _add_text_attrs(ds, {cf.attribute_table(key): texts for key, texts in attrs.items()})

    @_writes
    def add_dispatch(
        self,
        *,
        index_seq: int,
        call: int,
        kv_group: int,
        head_start: int,
        head_count: int,
        q_heads: int,
        kv_heads: int,
        q_rows: int,
        kv_len: int,
        head_dim: int,
        v_head_dim: int | None = None,
        batch: int = 1,
        mask_kind: str = "none",
        dtype: str = "",
        primitive: str,
        metal_primitive: str = "",
        t_start_ns: int = 0,
        t_end_ns: int = 0,
    ) -> None:
        """One attention primitive call; `index_seq` is the record of the op that made it."""
        if mask_kind not in cf.MASK_KINDS:
            raise ValueError(f"mask_kind must be one of {cf.MASK_KINDS}, not {mask_kind!r}")
        if primitive not in cf.PRIMITIVES:
            raise ValueError(f"primitive must be one of {cf.PRIMITIVES}, not {primitive!r}")
        if metal_primitive not in cf.METAL_PRIMITIVES:
            raise ValueError(f"metal_primitive must be one of {cf.METAL_PRIMITIVES}, not {metal_primitive!r}")
        sizes = {
            "batch": batch, "head_count": head_count, "q_heads": q_heads, "kv_heads": kv_heads, "q_rows": q_rows, "kv_len": kv_len,
            "head_dim": head_dim, "v_head_dim": head_dim if v_head_dim is None else v_head_dim,
        }
        refused = [f"{name} {value}" for name, value in sizes.items() if value < 1] + ([f"call {call}"] if call < 0 else [])
        refused += [f"heads {head_start}..{head_start + head_count - 1} of {q_heads}"] if head_start < 0 or head_start + head_count > q_heads else []
        refused += [f"kv_group {kv_group} of {kv_heads}"] if not -1 <= kv_group < kv_heads else []
        if refused:
            raise ValueError(
                f"dispatch of record {index_seq}: {', '.join(refused)}; sizes are at least 1, calls count from 0, "
                "heads and the KV group are the layer's"
            )
        if (index_seq, call) in self._calls:
            raise ValueError(f"record {index_seq} already has a dispatch row for call {call}")
        self._calls.add((index_seq, call))
        self._pending_dispatch.append(
            (
                index_seq,
                call,
                batch,
                kv_group,
                head_start,
                head_count,
                q_heads,
                kv_heads,
                q_rows,
                kv_len,
                head_dim,
                head_dim if v_head_dim is None else v_head_dim,
                mask_kind.encode(),
                dtype.encode(),
                cf.encode_field(primitive, cf.DISPATCH_DTYPE["primitive"], "primitive"),
                cf.encode_field(metal_primitive, cf.DISPATCH_DTYPE["metal_primitive"], "metal_primitive"),
                t_start_ns,
                t_end_ns,
            )
        )

    @_writes
    def add_token(self, *, step: int, segment: str, token_id: int, is_stop: bool) -> None:
        self._refuse_after_failure()
        if step < 0 or token_id < 0:
            raise ValueError(f"token step {step} and id {token_id} must both be at least 0")
        if (step, segment) in self._emitted:
            raise ValueError(f"step {step} segment {segment!r} already has a token; a forward call emits one")
        self._emitted.add((step, segment))
        self._pending_tokens.append(
            (step, cf.encode_field(segment, cf.TOKENS_DTYPE["segment"], "segment"), token_id, int(is_stop))
        )

    @_writes
    def end_step(self) -> None:
        """Write the step's buffered rows, flush, then commit them: `/index` first, then the
        dispatch and token tables, each commit one in-place attribute write and a flush.

        Before its commit nothing of the step is visible to a reader of the unfinished file, and
        after it nothing a reader needs for it is modified again.
        """
        self._refuse_after_failure()
        pending = {
            cf.INDEX_PATH: self._pending_index,
            cf.DISPATCH_PATH: self._pending_dispatch,
            cf.TOKENS_PATH: self._pending_tokens,
        }
        self._flush_pack()
        self._make_room(sum(len(pending[path]) * dtype.itemsize for path, dtype in TABLES))
        grown: list[h5py.Dataset] = []
        for path, dtype in TABLES:
            rows = pending[path]
            if rows:
                ds = self._file[path]
                _append_rows(ds, np.array(rows, dtype=dtype))
                rows.clear()
                grown.append(ds)
        if self._step_group is not None:
            self._step_group = None
            self._group += 1
        self._file.flush()
        for commit in ((cf.INDEX_PATH,), (cf.DISPATCH_PATH, cf.TOKENS_PATH)):
            tables = [ds for ds in grown if ds.name in commit]
            for ds in tables:
                _set_scalar(ds.id, cf.ATTR_COMMITTED_ROWS, np.array(ds.shape[0], dtype=np.int64))
            if tables:
                self._file.flush()
        self._publish_growing()

    def _publish_growing(self) -> None:
        """Rename a recording to `path` at its first committed step. Renamed with its empty
        structure, `--force` replaced a good capture with an empty one whenever the run stopped,
        crashed or was refused before its first step."""
        if self._complete_only or self._published:
            return
        os.replace(self._partial, self.path)
        self._published = True
        # No hidden file is left to guard, and readers that lock files (h5py's default, h5dump)
        # could not open a recording in progress while it was held.
        self._unlock()

    def _failed(self, exc: OSError | RuntimeError) -> FileUnwritable:
        """The writer's first failed write, kept (`_refuse_after_failure`), in words that say what is left at `path`."""
        if self._failure is None:
            failure = _unwritable(self.path, exc)
            if self._published:
                kept = "the steps written before it stay readable, and the capture reads as incomplete"
                failure = FileUnwritable(failure.errno, f"{failure.strerror}; {kept}", failure.filename)
            self._failure = failure
        return self._failure

    def _refuse_after_failure(self) -> None:
        """Nothing is written after a failed write: its step is dropped, the committed ones stay
        readable. Committing that step's rows after its pack failed pointed them at no data."""
        if self._failure is not None:
            raise self._failure

    def _make_room(self, nbytes: int) -> None:
        """Refuse a write of `nbytes` that leaves less than ROOM_MARGIN_BYTES of room."""
        if not nbytes:
            return
        room = room_for(self.path, self._file.id.get_filesize())
        if room < nbytes + ROOM_MARGIN_BYTES:
            raise FileUnwritable(
                errno.ENOSPC,
                f"cannot be written (no room left for it: {room:,} bytes free on its device or under the file size limit; "
                f"the next write takes {nbytes:,}, and {ROOM_MARGIN_BYTES // 1024**2} MiB more is kept for the file's own tables)",
                str(self.path),
            )

    @_writes
    def close(self) -> None:
        """Finish the file: the complete marker is the last thing written. The file is closed
        even when that fails: a file libhdf5 still held open at exit, after writes failed on a
        full disk, crashed the interpreter's exit (SIGSEGV in libhdf5's teardown)."""
        if not self._file.id.valid:
            return
        try:
            self.end_step()
            _set_scalar(self._file.id, cf.ATTR_COMPLETE, np.array(1, dtype=np.int8))
        except BaseException:
            self._release(finished=False)
            raise
        self._release(finished=True)

    @_writes
    def abandon(self) -> None:
        """Close without the complete marker, as a crashed writer would leave the file: without
        the step it was in, whose rows `end_step` never committed. Committing them here kept a
        recording stopped by Ctrl-C with a half-written last step (38 of its 41 records, no
        token), and a Ctrl-C inside `end_step` with tokens and calls of records never committed."""
        if self._file.id.valid:
            self._release(finished=False)

    def _release(self, finished: bool) -> None:
        """Close the file; with `complete_only`, rename it to `path` when it is finished, else
        remove it. The hidden file's lock goes last, once the file is renamed or removed."""
        try:
            self._publish(finished)
        finally:
            self._unlock()

    def _unlock(self) -> None:
        """Release the hidden file's lock (`held_partial`), once: a descriptor number closed twice may by then be another file's."""
        if self._lock != -1:
            os.close(self._lock)
            self._lock = -1

    def _publish(self, finished: bool) -> None:
        try:
            self._file.close()
        except BaseException:
            if not self._published:
                self._partial.unlink(missing_ok=True)
            raise
        if self._published:
            return
        try:
            if finished:
                fsync_file(self._partial)  # on disk before it replaces a good file: a power cut must not leave a torn one
                os.replace(self._partial, self.path)
                fsync_directory(self.path.parent)
        finally:
            self._partial.unlink(missing_ok=True)  # renamed away, or never to be published

    def __enter__(self) -> "CaptureWriter":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()
