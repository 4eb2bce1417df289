"""Reads of compressed datasets whose every chunk decodes to exactly its declared size, or fails by name.

libhdf5's deflate filter inflates a chunk's stored stream for as long as the stream goes on: a
chunk declared as 3,840 bytes whose stream inflates to 3 GiB takes 3 GiB of memory, and a
stream that ends short leaves the rest of the chunk as whatever the buffer held; neither is an
error (docs/capture-format.md, "What a reader refuses"). A budget on declared sizes cannot see either. So a dataset with a
filter pipeline is never decoded by libhdf5 here: the stored bytes of each chunk a selection
touches are read raw (`H5Dread_chunk`, after checking they lie inside the file and within the
memory budget) and the pipeline is undone in reverse order, each stage stopping one byte past
the chunk's declared size. A stage whose output is not exactly that size is a problem located
at the dataset and the chunk's offset; nothing larger than one chunk ever exists in memory.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import zlib
from collections.abc import Callable

import h5py
import numpy as np

from sessions.capture.hdf5_safety import Problem, UnsafeObject

FILTER_DEFLATE = 1
FILTER_SHUFFLE = 2
FILTER_LZF = 32000

Selection = tuple[slice | int, ...] | None


class BadChunk(Exception):
    """What is wrong with one chunk's stored stream (the caller adds where)."""


INFLATE_PIECE_BYTES = 4 * 1024**2
"""A deflate stream is inflated this much at a time, into the chunk's own buffer, and fed to zlib
this much at a time: inflated at once, zlib grows its output in blocks and then joins them, which
held a chunk twice (a chunk of almost 2 GiB took 4.3 GB); fed whole, what zlib had not used yet
came back as a copy at every piece, which made a chunk that compresses poorly take time growing
with the square of its size (256 MiB: 5.2 s and 764 MiB more). A piece is held twice while zlib joins it."""


def _inflate(data: bytes | bytearray, size: int) -> bytearray:
    """A zlib stream's output, stopping one byte past `size` whatever the stream declares."""
    inflater = zlib.decompressobj()
    out = bytearray(size)
    view, stored = memoryview(out), memoryview(data)
    done, fed = 0, 0
    pending: bytes | memoryview = b""
    try:
        while not inflater.eof:
            if not pending:
                if fed == len(stored):
                    break  # the stream ran out before its end
                pending = stored[fed : fed + INFLATE_PIECE_BYTES]
                fed += len(pending)
            piece = inflater.decompress(pending, min(INFLATE_PIECE_BYTES, size + 1 - done))
            pending = inflater.unconsumed_tail
            if len(piece) > size - done:
                raise BadChunk(f"its deflate stream inflates past the chunk's declared {size} bytes (a decompression bomb)")
            view[done : done + len(piece)] = piece
            done += len(piece)
            del piece  # before the next piece is made: two would be held
    except zlib.error as exc:
        reason = str(exc).rpartition(": ")[2]  # zlib's own words, without Python's "Error -3 while decompressing data"
        raise BadChunk(f"its deflate stream is corrupt ({reason})") from None
    if done < size:
        raise BadChunk(f"its deflate stream ends after {done} of the chunk's {size} bytes")
    if not inflater.eof:
        raise BadChunk("its deflate stream is cut off before its end")
    return out


@functools.cache
def liblzf() -> Callable[..., int] | None:
    """liblzf's `lzf_decompress`, as h5py builds it into its h5z module for filter 32000; None where
    the module does not export it (then the Python decoder below does the same work, slowly).

    It stops with E2BIG at the end of the output buffer it is given and with EINVAL on a
    reference before the start or a run past the input, so given exactly the chunk's size it
    is the bounded decoder this module needs, at C speed (37 times the Python loop's).
    """
    try:
        function = ctypes.CDLL(h5py.h5z.__file__, use_errno=True).lzf_decompress
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_uint
    function.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint]
    return function  # type: ignore[no-any-return]


_LZF_PAST_END = "its LZF stream decodes past the chunk's declared {size} bytes"
_LZF_CORRUPT = "its LZF stream is corrupt (a reference before the chunk's start, or a run past the stream's end)"
_LZF_SHORT = "its LZF stream ends after {done} of the chunk's {size} bytes"


LZF_MOST_PER_BYTE = 88
"""The most bytes LZF decodes from one stored byte: its longest back-reference, 3 bytes, copies 264."""
_LZF_TOO_SHORT = "its LZF stream of {stored} bytes cannot decode to the chunk's declared {size} bytes (at most {most} per stored byte)"


def _unlzf(stored: bytes | bytearray, size: int) -> bytes:
    """An LZF stream (h5py's filter 32000, no header) decoded into exactly `size` bytes, or refused.

    liblzf decodes into a buffer of the declared size, which takes that much memory before the
    first byte is decoded; a declared size the stream cannot reach is refused before it."""
    data = bytes(stored)  # what an inflate before it made is a bytearray, which ctypes' char pointer refuses
    if size > LZF_MOST_PER_BYTE * len(data):
        raise BadChunk(_LZF_TOO_SHORT.format(stored=len(data), size=size, most=LZF_MOST_PER_BYTE))
    decompress = liblzf()
    if decompress is None or max(len(data), size) >= 2**32:
        return unlzf_python(data, size)
    out = ctypes.create_string_buffer(size)
    ctypes.set_errno(0)
    done = decompress(data, len(data), out, size)
    if done == 0 and ctypes.get_errno() == errno.E2BIG:
        raise BadChunk(_LZF_PAST_END.format(size=size))
    if done == 0 and ctypes.get_errno() == errno.EINVAL:
        raise BadChunk(_LZF_CORRUPT)
    if done != size:
        raise BadChunk(_LZF_SHORT.format(done=done, size=size))
    return out.raw


def unlzf_python(data: bytes, size: int) -> bytes:
    """`_unlzf` in Python, for an h5py that does not export liblzf (about 8 MB/s).

    liblzf's format: a control byte below 32 starts a run of ctrl+1 literal bytes; any other
    is a back-reference of length (ctrl >> 5) + 2 (a length field of 7 continues in the next
    byte) to an offset taken from its low 5 bits and the next byte. The checks come in
    liblzf's order, so both decoders refuse a stream with the same words.
    """
    out = bytearray()
    end = len(data)
    i = 0
    while i < end:
        ctrl = data[i]
        i += 1
        if ctrl < 32:
            run = ctrl + 1
            if len(out) + run > size:
                raise BadChunk(_LZF_PAST_END.format(size=size))
            if i + run > end:
                raise BadChunk(_LZF_CORRUPT)
            out += data[i : i + run]
            i += run
            continue
        length = ctrl >> 5
        if length == 7 and i < end:
            length += data[i]
            i += 1
        if i >= end:
            raise BadChunk(_LZF_CORRUPT)
        distance = ((ctrl & 0x1F) << 8) + data[i] + 1
        i += 1
        length += 2
        start = len(out) - distance
        if len(out) + length > size:
            raise BadChunk(_LZF_PAST_END.format(size=size))
        if start < 0:
            raise BadChunk(_LZF_CORRUPT)
        if distance >= length:
            out += out[start : start + length]
        else:
            out += (out[start:] * (length // distance + 1))[:length]
    if len(out) != size:
        raise BadChunk(_LZF_SHORT.format(done=len(out), size=size))
    return bytes(out)


def _unshuffle(data: bytes | bytearray, element_size: int) -> bytes | bytearray:
    """Undo HDF5's shuffle filter: byte k of every element was stored together, for k = 0, 1, ..."""
    count = len(data) // element_size
    if element_size <= 1 or count <= 1:
        return data
    body = np.frombuffer(data, dtype=np.uint8, count=count * element_size).reshape(element_size, count)
    return body.T.tobytes() + data[count * element_size :]


class ChunkedReader:
    """The bounded reader of one filtered, chunked dataset (built once, used for many selections)."""

    def __init__(self, dataset: h5py.Dataset, location: str, budget: int, file_size: int) -> None:
        dcpl = dataset.id.get_create_plist()
        self._dataset = dataset
        self._location = location
        self._budget = budget
        self._file_size = file_size
        self._pipeline = [dcpl.get_filter(i)[:3] for i in range(dcpl.get_nfilters())]
        self._chunk = tuple(int(c) for c in dcpl.get_chunk())
        self._chunk_bytes = int(np.prod(self._chunk, dtype=np.int64)) * dataset.dtype.itemsize
        self._last: tuple[tuple[int, ...], np.ndarray | None] | None = None
        """The chunk decoded last: a pack's small records share chunks, and are read one after another."""

    def _fail(self, offset: tuple[int, ...], problem: str) -> UnsafeObject:
        return UnsafeObject(Problem(f"{self._location} chunk at {offset}", problem))

    def _decode(self, offset: tuple[int, ...]) -> np.ndarray | None:
        """One chunk's elements in the chunk's shape, or None where no chunk was written (fill value)."""
        if self._last is not None and self._last[0] == offset:
            return self._last[1]
        self._last = None
        decoded = self._decode_stored(offset)
        self._last = (offset, decoded)
        return decoded

    def _decode_stored(self, offset: tuple[int, ...]) -> np.ndarray | None:
        dsid = self._dataset.id
        info = dsid.get_chunk_info_by_coord(offset)
        if info.byte_offset is None:
            return None
        if info.size > self._budget:
            raise self._fail(offset, f"stores {info.size} bytes, over the memory budget of {self._budget}")
        if info.byte_offset + info.size > self._file_size:
            raise self._fail(
                offset, f"its stored bytes end at {info.byte_offset + info.size}, past the end of the file ({self._file_size} bytes): truncated"
            )
        mask, data = dsid.read_direct_chunk(offset)
        try:
            for position in reversed(range(len(self._pipeline))):
                if mask & (1 << position):
                    continue
                code, _, values = self._pipeline[position]
                if code == FILTER_DEFLATE:
                    data = _inflate(data, self._chunk_bytes)
                elif code == FILTER_LZF:
                    data = _unlzf(data, self._chunk_bytes)
                elif code == FILTER_SHUFFLE:
                    data = _unshuffle(data, int(values[0]) if values else self._dataset.dtype.itemsize)
                else:
                    raise BadChunk(f"uses filter id {code}, which no reader here decodes")
        except BadChunk as exc:
            raise self._fail(offset, str(exc)) from None
        if len(data) != self._chunk_bytes:
            raise self._fail(offset, f"holds {len(data)} bytes once decoded; its declared size is {self._chunk_bytes}")
        return np.frombuffer(data, dtype=self._dataset.dtype).reshape(self._chunk)

    def read(self, selection: Selection = None) -> np.ndarray:
        """The stored elements of `selection` (ints and slices with positive steps, as h5py takes them)."""
        shape = self._dataset.shape
        parts = () if selection is None else selection if isinstance(selection, tuple) else (selection,)
        if len(parts) > len(shape):
            raise ValueError(f"selection {selection} has more dimensions than shape {shape}")
        box: list[tuple[int, int]] = []
        local: list[slice | int] = []
        for axis, extent in enumerate(shape):
            part = parts[axis] if axis < len(parts) else slice(None)
            if isinstance(part, slice):
                start, stop, step = part.indices(extent)
                if step < 1:
                    raise ValueError("selection steps must be positive")
                stop = max(start, stop)
                box.append((start, stop))
                local.append(slice(0, stop - start, step))
            else:
                index = int(part) + extent if int(part) < 0 else int(part)
                if not 0 <= index < extent:
                    raise IndexError(f"index {part} is out of range for an axis of {extent}")
                box.append((index, index + 1))
                local.append(0)
        out = np.empty(tuple(stop - start for start, stop in box), dtype=self._dataset.dtype)
        if out.size:
            self._fill_box(out, box)
        return out[tuple(local)]

    def _fill_box(self, out: np.ndarray, box: list[tuple[int, int]]) -> None:
        ranges = [range(start // c, (stop - 1) // c + 1) for (start, stop), c in zip(box, self._chunk)]
        for index in itertools.product(*ranges):
            origin = tuple(i * c for i, c in zip(index, self._chunk))
            source, target = [], []
            for (start, stop), o, c in zip(box, origin, self._chunk):
                low, high = max(start, o), min(stop, o + c)
                source.append(slice(low - o, high - o))
                target.append(slice(low - start, high - start))
            chunk = self._decode(origin)
            if chunk is None:
                out[tuple(target)] = self._dataset.fillvalue  # a chunk never written reads as the fill value
            else:
                out[tuple(target)] = chunk[tuple(source)]


def has_filters(dataset: h5py.Dataset) -> bool:
    return dataset.id.get_create_plist().get_nfilters() > 0
