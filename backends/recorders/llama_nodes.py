"""llama.cpp's graph nodes read as arrays: what the recorder's eval callback keeps of each node.

A node is read only through the `ggml_tensor` mirror proven by
`backends.recorders.ggml_tensor_struct.check_layout`, with `ggml_backend_tensor_get` and the
node's strides; host memory is viewed in place while the callback runs. Shapes are ggml's `ne`
reversed, trimmed of its padding 1s but never below the rank a node has in a call of two rows
(`LlamaRun` probes one). A node whose elements are a batch's requests in turn gets a leading
request axis (`request_ne`); quantized nodes are kept as GGML blocks, or decoded by `gguf`.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

import numpy as np

from backends.recorders.ggml_tensor_struct import GgmlLibrary, tensor_at
from sessions.bits.dtypes import LOGICAL_DTYPES

PLAIN_TYPES: dict[int, tuple[str, np.dtype]] = {
    0: ("float32", np.dtype("<f4")),
    1: ("float16", np.dtype("<f2")),
    30: ("bfloat16", np.dtype("<u2")),
    24: ("int8", np.dtype("i1")),
    25: ("int16", np.dtype("<i2")),
    26: ("int32", np.dtype("<i4")),
    27: ("int64", np.dtype("<i8")),
    28: ("float64", np.dtype("<f8")),
}
INDEX_TYPES = (26, 27)
"""ggml_type ids of SET_ROWS indices (I32, I64)."""
_DEFAULT_NAME = re.compile(r"^node_\d+$")
_NAME_LAYER = re.compile(r"-(\d+)(?: \([a-z ]+\))*$")
"""`Qcur-3`, also with the suffixes ggml appends to derived views: `Qcur-3 (view) (permuted)`."""
_CACHE_LAYER = re.compile(r"^cache_[kv]_l(\d+)\b")
_WEIGHT_LAYER = re.compile(r"^blk\.(\d+)\.")


class RecorderError(RuntimeError):
    """A run that cannot be recorded faithfully, with what went wrong."""



@dataclass
class NodeRead:
    name: str
    op: str
    sources: list[str]
    layer: int
    dtype: str
    bits: np.ndarray
    """May view llama.cpp's own memory: valid only until the callback that read it returns."""
    logical_shape: tuple[int, ...] | None = None
    stacked: bool = False
    """Axis 0 holds the requests of a batched call, one row each (the recorder added it)."""

    def request_shape(self) -> tuple[int, ...]:
        """The shape of one request's part: what a run of that request alone records."""
        shape = tuple(self.logical_shape or self.bits.shape)
        return shape[1:] if self.stacked else shape

    def requests(self) -> int:
        """How many requests the node holds, one per row of axis 0 when stacked."""
        return (self.logical_shape or self.bits.shape)[0] if self.stacked else 1


def request_ne(ne: list[int], rows: int, batch: int) -> list[int] | None:
    """One request's ggml shape in a node of a call over `batch` equally long sequences, or None
    when the node's elements are not the requests one after another.

    llama.cpp gives every per-token tensor the call's tokens as its outermost dimension, each
    sequence's `rows` tokens in turn in seq_id order (its equal split of a batch), and with one KV
    cache stream per sequence (`kv_unified` off) the attention tensors a fourth dimension of one
    stream per sequence. Anything else (the KV cache buffers and their writes) holds every request
    in a layout that is not a row per request."""
    if ne[3] == batch:
        return ne[:3] + [1]
    outer = max((i for i in range(4) if ne[i] != 1), default=0)
    if ne[outer] == batch * rows:
        return ne[:outer] + [rows] + ne[outer + 1 :]
    return None


def node_view(data: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A node's elements as a view of its bytes. numpy refuses strides that reach past `data`
    (ggml_nbytes spans the last element, so a node read through a correct mirror never does);
    `as_strided` would read whatever memory lies there."""
    try:
        return np.ndarray(shape, dtype=dtype, buffer=data, strides=strides)
    except (TypeError, ValueError) as exc:
        raise RecorderError(f"a node's shape {shape} and strides {strides} reach past its {data.size} bytes ({exc})") from None


def node_layer(name: str, sources: list[str]) -> int:
    for pattern, text in ((_NAME_LAYER, name), (_CACHE_LAYER, name)):
        found = pattern.search(text)
        if found:
            return int(found.group(1))
    for source in sources:
        found = _WEIGHT_LAYER.match(source)
        if found:
            return int(found.group(1))
    return -1


def _rank(ne: list[int]) -> int:
    """How many of ggml's four dimensions are left once its trailing padding 1s are trimmed."""
    return max((i + 1 for i in range(4) if ne[i] != 1), default=1)


def _is_weight(name: str) -> bool:
    return name.endswith(".weight")


Described = tuple[str, str, list[str]]
"""A node's name, op and source names, as `NodeReader.describe` reads them."""


class NodeReader:
    """Reads one computed node through the proven mirror; never calls into ggml on a bad node
    (a ggml assertion would abort the whole process)."""

    def __init__(self, library: GgmlLibrary) -> None:
        self.library = library
        self._ranks: dict[tuple[str, str, int], int] = {}
        self._host: dict[int, bool] = {}
        """Backend buffer address -> whether its memory is host memory, for one llama_decode (a
        buffer freed between calls may leave its address to another backend's)."""

    def new_call(self) -> None:
        """A new llama_decode: its graph may hold other buffers."""
        self._host.clear()

    def describe(self, address: int) -> Described:
        node = tensor_at(address)
        name = node.name.decode("utf-8", "replace")
        sources = [tensor_at(src).name.decode("utf-8", "replace") for src in node.src if src]
        return name, self.library.op_desc(address), sources

    def wanted(self, name: str, op: str, sources: list[str], *, all_nodes: bool, whole_cache: bool) -> bool:
        """Whether a node is recorded (`LlamaSettings.all_nodes`, `LlamaSettings.whole_cache`)."""
        if not whole_cache and op != "SET_ROWS" and _CACHE_LAYER.match(name):
            return False
        return all_nodes or not _DEFAULT_NAME.match(name) or any(_is_weight(s) for s in sources)

    def _host_bytes(self, address: int, node: ctypes.Structure | None = None) -> np.ndarray:
        """The tensor's memory as bytes: viewed in place for host memory (valid while the callback
        runs), copied out of any other backend's. `node`: the tensor at `address`, when read already."""
        node = tensor_at(address) if node is None else node
        lib = self.library.lib
        buffer = tensor_at(node.view_src).buffer if node.view_src else node.buffer
        if not buffer or not node.data:
            name = node.name.decode("utf-8", "replace")
            raise RecorderError(f"node {name!r} ({self.library.op_desc(address)}) has no readable buffer")
        size = int(lib.ggml_nbytes(address))
        host = self._host.get(buffer)
        if host is None:
            host = self._host[buffer] = bool(lib.ggml_backend_buffer_is_host(buffer))
        if host:
            return np.frombuffer((ctypes.c_uint8 * size).from_address(node.data), dtype=np.uint8)
        raw = (ctypes.c_uint8 * size)()
        if size:
            lib.ggml_backend_tensor_get(address, raw, 0, size)
        return np.frombuffer(raw, dtype=np.uint8)

    def learn_rank(self, ne: list[int], key: tuple[str, str, int], batch: int) -> None:
        """Remember the rank a node has in a call of two rows per request (`LlamaRun` probes one
        before recording), where the row axis is never a padding 1."""
        request = request_ne(ne, 2, batch) if batch > 1 else None
        self._ranks[key] = _rank(ne if request is None else request)

    def _shape(self, ne: list[int], key: tuple[str, str, int]) -> tuple[int, ...]:
        """numpy shape = ggml ne reversed, trimmed of ggml's padding 1s, but never below the rank
        the node has in a call of two rows: [rows, X] stays 2-D at rows = 1."""
        rank = max(_rank(ne), self._ranks.get(key, 0))
        return tuple(reversed(ne[:rank]))

    def read(self, address: int, described: Described, key: tuple[str, str, int], layer: int, rows: int, batch: int = 1) -> NodeRead:
        """The node's elements; in a call over `batch` requests of `rows` tokens each, stacked
        with a leading request axis when its elements are the requests one after another (a
        reshape: the bits stay where llama.cpp put them), else whole."""
        name, op, sources = described
        node = tensor_at(address)
        # Host memory (the CPU backend's) is viewed where llama.cpp keeps it, for as long as the
        # callback runs, so the writer's copy into its pack is the only one.
        data = self._host_bytes(address, node)
        ne = list(node.ne)
        request = request_ne(ne, rows, batch) if batch > 1 else None
        shape = self._shape(ne, key) if request is None else (batch, *self._shape(request, key))
        if batch > 1 and request is None and shape[0] == batch:
            raise RecorderError(
                f"node {name!r} ({op}) holds the whole batch in one layout, yet its axis 0 is {batch}, which a reader "
                "would take for the batch's requests: record with another batch size"
            )
        # All four ggml dimensions, padding 1s included: C order over them is C order over `shape`.
        whole = tuple(reversed(ne))
        strides = tuple(reversed(node.nb))
        ggml_type = int(node.type)
        if ggml_type in PLAIN_TYPES:
            dtype, np_dtype = PLAIN_TYPES[ggml_type]
            # A view in llama.cpp's memory, strided or not: the writer copies it once, into its pack.
            view = node_view(data, np_dtype, whole, strides)
            return NodeRead(name, op, sources, layer, dtype, view.reshape(shape), stacked=request is not None)
        row_bytes = self._row_bytes(ggml_type, whole[-1])
        rows = node_view(data, np.dtype(np.uint8), whole[:-1] + (row_bytes,), strides[:-1] + (1,))
        return self._quantized(ggml_type, np.ascontiguousarray(rows), shape, name, op, sources, layer, stacked=request is not None)

    def read_written(self, address: int, described: Described, layer: int, rows: int, batch: int = 1) -> NodeRead:
        """The cells a `SET_ROWS` node wrote, in the order of its index tensor, instead of the whole
        destination it returns (a KV cache: every cell so far, at every step).

        Read from the destination after the node ran, so they are the stored bits (an F16 cache's
        rounding included). The V cache without flash attention is transposed, one element per
        index; llama.cpp orders those indices token by token, so each token's elements still come
        out as one row. Stored as [tokens, elements], stacked by request in a batch."""
        name, op, sources = described
        node = tensor_at(address)
        indices = tensor_at(node.src[1])
        ne, index_ne, index_type = [int(n) for n in node.ne], [int(n) for n in indices.ne], int(indices.type)
        tokens = rows * batch
        if ne[2:] != [1, 1] or index_ne[1:] != [1, 1, 1] or index_type not in INDEX_TYPES or not tokens or index_ne[0] % tokens:
            raise RecorderError(
                f"node {name!r} ({op}) is not a 2-D write through a 1-D integer index of whole tokens ({index_ne}): record the whole cache"
            )
        index = self._host_bytes(node.src[1]).view(PLAIN_TYPES[index_type][1])[: index_ne[0]].astype(np.int64)
        if index.size and (index.min() < 0 or index.max() >= ne[1]):
            raise RecorderError(f"node {name!r} ({op}) writes rows {int(index.min())}..{int(index.max())} of {ne[1]}: outside its destination")
        ggml_type = int(node.type)
        row_bytes = self._row_bytes(ggml_type, ne[0])
        destination = node_view(self._host_bytes(address), np.dtype(np.uint8), (ne[1], row_bytes), (int(node.nb[1]), 1))
        written = destination[index]
        shape: tuple[int, ...] = (rows, index.size // tokens * ne[0])
        if batch > 1:
            shape = (batch, *shape)
        name = f"{name} (written)"
        if ggml_type in PLAIN_TYPES:
            dtype, np_dtype = PLAIN_TYPES[ggml_type]
            return NodeRead(name, op, sources, layer, dtype, written.view(np_dtype).reshape(shape), stacked=batch > 1)
        return self._quantized(ggml_type, written, shape, name, op, sources, layer, stacked=batch > 1)

    def mask_kind(self, address: int, first: int, rows: int) -> str:
        """The kind of the mask tensor at `address` (a `SOFT_MAX` node's second source; 0: none):
        `causal` when it is, value for value, the causal mask of these rows over the cache (0 up
        to each row's own position `first + i`, -inf after, every stream alike), `additive` for
        any other values (a sliding window, sequences sharing a cache), `none` without one. Only
        a mask the capture can name completely lets a rerun or diagnosis apply it."""
        if not address:
            return "none"
        mask = tensor_at(address)
        ne, ggml_type = [int(n) for n in mask.ne], int(mask.type)
        if ggml_type not in (0, 1) or ne[1] < rows or ne[2] != 1:
            return "additive"
        strides = tuple(int(b) for b in reversed(list(mask.nb)))
        values = node_view(self._host_bytes(address), PLAIN_TYPES[ggml_type][1], tuple(reversed(ne)), strides)[:, 0, :rows]
        visible = np.arange(ne[0])[None, :] <= first + np.arange(rows)[:, None]
        causal = np.broadcast_to(np.where(visible, np.float32(0), np.float32(-np.inf)), values.shape)
        return "causal" if np.array_equal(values.astype(np.float32), causal) else "additive"

    def _row_bytes(self, ggml_type: int, elements: int) -> int:
        lib = self.library.lib
        return elements // int(lib.ggml_blck_size(ggml_type)) * int(lib.ggml_type_size(ggml_type))

    def _quantized(
        self, ggml_type: int, rows: np.ndarray, shape: tuple[int, ...], name: str, op: str, sources: list[str], layer: int, stacked: bool,
    ) -> NodeRead:
        """GGML blocks, one row of them per row of `rows`: kept raw when the capture format knows
        the type, else decoded by `gguf`."""
        import gguf

        row_bytes = rows.shape[-1]
        type_name = self.library.type_name(ggml_type)
        logical = type_name.lower()
        if logical in LOGICAL_DTYPES:
            return NodeRead(name, op, sources, layer, logical, rows.reshape(-1, row_bytes), shape, stacked)
        try:
            qtype = gguf.GGMLQuantizationType(ggml_type)
            values = gguf.quants.dequantize(rows.reshape(-1, row_bytes), qtype).reshape(shape)
        except (ValueError, NotImplementedError) as exc:
            raise RecorderError(f"node {name!r} ({op}) has type {type_name}, which gguf cannot decode ({exc})") from None
        return NodeRead(name, op, sources + [f"decoded-from:{type_name}"], layer, "float32", values.astype(np.float32), stacked=stacked)
