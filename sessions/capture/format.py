"""Capture format v1: the HDF5 layout every writer and reader agrees on.

docs/capture-format.md is the normative description for engines that write captures with
libhdf5 alone; this module is its executable twin. Every string is a fixed-length UTF-8
field: variable-length strings live in the global heap, whose reader hangs on crafted input
(docs/capture-format.md, "What a reader refuses"), so the format has none.
"""

from __future__ import annotations

import h5py
import numpy as np

FORMAT_NAME = "parity-xray-capture"
FORMAT_VERSION = 1
MAX_NDIM = 8

RERUN_ROLE = "rerun"
"""A capture `parity-xray rerun --save` (or the window's Save) wrote: the ops it recomputed, nothing else."""
ROLES = ("native", "oracle", RERUN_ROLE)
SEGMENTS = ("text-before", "visual", "text-after", "prefill", "decode")
MASK_KINDS = ("none", "causal", "bool", "additive")
MLX_PRIMITIVES = ("sdpa_vector", "sdpa_vector_2pass", "sdpa_full", "fallback")
PRIMITIVES = (*MLX_PRIMITIVES, "flash_attn_ext")
"""A dispatch row's `primitive`: MLX's fused kernels or its decomposed fallback (a decomposed
llama.cpp attention too), or ggml's fused flash-attention op."""
METAL_PRIMITIVES = ("", "unknown", *MLX_PRIMITIVES)
"""A dispatch row's `metal_primitive`: empty when not predicted, "unknown" when no rule table covers the MLX version."""

INDEX_PATH = "/index"
DISPATCH_PATH = "/dispatch"
TOKENS_PATH = "/tokens"
TENSORS_GROUP = "/tensors"

ATTR_FORMAT = "format"
ATTR_VERSION = "format_version"
ATTR_COMPLETE = "complete"
ATTR_PROVENANCE = "provenance_json"
ATTR_LOGICAL_DTYPE = "logical_dtype"
ATTR_LOGICAL_SHAPE = "logical_shape"
ATTR_COMMITTED_ROWS = "committed_rows"
"""On each table: the rows a writer had flushed when it last finished a step. A reader of an
unfinished file shows only those, since rows past them may be torn."""

STRING_ATTRS = (
    "role",
    "engine_name",
    "engine_version",
    "engine_commit",
    "model_id",
    "weights_hash",
    "device",
    "compiler",
    "created_utc",
    "prompt",
)
MULTILINE_STRING_ATTRS = ("prompt",)
"""Text attributes that may hold newlines and tabs; every other text attribute is one line of
printable text (a control character is refused: it would reach the terminal)."""
INT_ATTRS = ("seed", "batch_size", "batch_row", "batch_stacked")
"""`batch_size` and `batch_row` (both optional): a run of `batch_size` requests in one batch, whose
records hold every request along stored axis 0, compared for the request in row `batch_row`;
`batch_stacked` (optional, 0 or 1): 1 when that axis was added to stack the requests, so a request's
record is that row with axis 0 removed."""


def utf8(n: int) -> np.dtype:
    """A fixed-length, NUL-padded UTF-8 field of n bytes: numpy 'S{n}' tagged so h5py writes H5T_CSET_UTF8."""
    return h5py.string_dtype("utf-8", n)


INDEX_DTYPE = np.dtype(
    [
        ("seq", "<i8"),
        ("step", "<i4"),
        ("segment", utf8(16)),
        ("layer", "<i4"),
        ("name", utf8(64)),
        ("occurrence", "<i4"),
        ("dtype", utf8(16)),
        ("ndim", "<i4"),
        ("shape", "<i8", (MAX_NDIM,)),
        ("path", utf8(64)),
        ("kernel_id", utf8(64)),
        ("contract_id", utf8(64)),
        ("effective_contract_id", utf8(64)),
        ("t_start_ns", "<i8"),
        ("t_end_ns", "<i8"),
        ("position", "<i8"),
        ("offset", "<i8"),
        ("nbytes", "<i8"),
    ]
)

INDEX_OPTIONAL_FIELDS = {"position": -1, "offset": -1, "nbytes": -1}
"""Index fields a file may lack (written before they existed), with the value such rows read as.
`position` is the absolute token position of the record's first row (canonical rows axis); -1
unknown, which alignment by position then derives from segment order. `offset` and `nbytes`
place a packed record's bytes in the pack its `path` names; -1 (both) when `path` names a
dataset holding the tensor alone, the layout of every file written before packs existed."""

DISPATCH_DTYPE = np.dtype(
    [
        ("index_seq", "<i8"),
        ("call", "<i4"),
        ("batch", "<i4"),
        ("kv_group", "<i4"),
        ("head_start", "<i4"),
        ("head_count", "<i4"),
        ("q_heads", "<i4"),
        ("kv_heads", "<i4"),
        ("q_rows", "<i4"),
        ("kv_len", "<i4"),
        ("head_dim", "<i4"),
        ("v_head_dim", "<i4"),
        ("mask_kind", utf8(16)),
        ("dtype", utf8(16)),
        ("primitive", utf8(32)),
        ("metal_primitive", utf8(32)),
        ("t_start_ns", "<i8"),
        ("t_end_ns", "<i8"),
    ]
)

INDEX_STRING_FIELDS = tuple(n for n in INDEX_DTYPE.names if INDEX_DTYPE[n].kind == "S")
INDEX_INT_FIELDS = ("seq", "step", "layer", "occurrence", "ndim", "t_start_ns", "t_end_ns", "position", "offset", "nbytes")

TOKENS_DTYPE = np.dtype(
    [
        ("step", "<i4"),
        ("segment", utf8(16)),
        ("token_id", "<i8"),
        ("is_stop", "<i1"),
    ]
)


STEP_BLOCKS = 32
"""The reference writer's /tensors holds blocks b00..b31, created with the file; block j holds the
step groups 2**j - 1 .. 2**(j+1) - 2, created together when the first of them is needed."""


def step_block(group: int) -> int:
    """The block of step group `group` (0, 1, 2… in the order the writer finished its steps)."""
    return (group + 1).bit_length() - 1


def step_group_path(group: int) -> str:
    return f"{TENSORS_GROUP}/b{step_block(group):02d}/s{group:07d}"


def tensor_path(seq: int, group: int = 0) -> str:
    """Where the reference writer puts tensor `seq` as a dataset of its own, in step group `group`."""
    return f"{step_group_path(group)}/t{seq:08d}"


def pack_path(first_seq: int, group: int = 0) -> str:
    """Where the reference writer puts the pack whose first tensor is `first_seq`, in step group `group`."""
    return f"{step_group_path(group)}/p{first_seq:08d}"


def attribute_table(name: str) -> str:
    """The name of the attribute of a pack that holds recorder attribute `name` of each of its
    records (`ggml_src[]`): element i is the i-th record whose bytes the pack holds, in seq order."""
    return f"{name}[]"


ATTRIBUTE_TABLE_BYTES = 60_000
"""Largest attribute table a writer makes (elements x element size): libhdf5 refuses an attribute
over 64 KiB in a file of the default format version."""


def packed_attribute(name: str, seq: int) -> str:
    """The name of a packed record's recorder attribute `name` on its pack in files written
    before attribute tables: one attribute per record (`ggml_src[123]`)."""
    return f"{name}[{seq}]"


def decode_field(raw: bytes | np.bytes_) -> str:
    """A fixed-length field as text: NUL padding stripped, invalid UTF-8 shown, never raised."""
    return bytes(raw).rstrip(b"\0").decode("utf-8", errors="replace")


def encode_field(text: str, dtype: np.dtype, field: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > dtype.itemsize:
        raise ValueError(f"{field} {text!r} is {len(raw)} bytes; the field holds {dtype.itemsize}")
    return raw
