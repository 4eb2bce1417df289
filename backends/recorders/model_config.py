"""A model's hyperparameters as a capture's provenance `config` carries them.

A rerun recomputes norms and RoPE, so it needs the scalars the engine ran with (RMSNorm's eps,
RoPE's base). The recorders write them beside the tensors, so that a capture describes its
model; a capture recorded without them takes them from the weights file it references.
Names are Hugging Face's (config.json), the names the demo engines and docs/capture-format.md
use, whatever file the values came from.

A GGUF is read by `read_gguf_header`, not the gguf package's GGUFReader: weights files come
from other people, and GGUFReader materialises every metadata field (a 24 MB file of three
million empty strings took minutes and 5 GB) and fails on malformed counts with IndexError
or RecursionError. The walk here keeps only the scalars and the tensor directory, skips
arrays without building them, and checks every count, length and offset against the file
and a budget before using it, so a bad file is a one-line GGUFFileError.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sessions.side_file import open_regular_file, read_side_file

MLX_WEIGHT_FILES = "model*.safetensors"
"""The files of an mlx-lm model folder that mlx-lm loads as its weights (`mlx_lm.utils.load_model`):
an adapter or another safetensors file beside them is not the model's."""

GGUF_KEYS = {
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "vocab_size": "vocab_size",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
    "max_position_embeddings": "context_length",
}
"""Config name -> its GGUF metadata key below `<general.architecture>.`."""


class ModelConfigError(ValueError):
    """A weights file whose model config cannot be read, with the file and what is wrong."""


class GGUFFileError(ModelConfigError):
    """A GGUF that is malformed or past the budget below, named with what is wrong."""


GGUF_VERSIONS = (2, 3)
"""The versions GGUFReader reads too (1 used 32-bit counts and is long gone)."""
MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A Hugging Face config.json is a few KiB; one beside someone else's weights is read no further."""
MAX_GGUF_NAME = 65535
"""Longest key or tensor name (the GGUF spec's limit): anything longer is corrupt."""
MAX_KEPT_STRING = 4096
"""Longest string value kept; longer ones (chat templates) are skipped: no rerun reads them."""
MAX_METADATA_ELEMENTS = 1 << 22
"""Array elements walked in all: real tokenizers hold under a million (Gemma 3: 3 x 262,144),
and walking is what a file of millions of tiny strings costs."""
MAX_ARRAY_DEPTH = 2
"""Arrays of arrays this deep at most; nothing real nests at all."""
MAX_TENSORS = 1 << 20
GGML_MAX_DIMS = 4
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""GGUF value type -> struct format of the fixed-size types (8 is a string, 9 an array)."""
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    """Where one tensor's bytes lie, as the tensor directory declares them (checked against the file)."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    """GGUF order: the row length (ne0) first; numpy's shape is the reverse."""
    offset: int
    """From the start of the file."""
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    metadata: dict[str, Any]
    """Scalar values by key; arrays and long strings are skipped, not kept."""
    tensors: dict[str, GGUFTensor]


class _Walk:
    """A cursor over the file's bytes that refuses to read past its end."""

    def __init__(self, path: Path, data: bytes | mmap.mmap) -> None:
        self.path, self.data, self.pos, self.endian = path, data, 0, "<"
        self.elements = 0

    def fail(self, what: str) -> GGUFFileError:
        return GGUFFileError(f"{self.path}: not a usable GGUF ({what})")

    def take(self, size: int, what: str) -> int:
        """Claim `size` bytes; returns where they start."""
        if size > len(self.data) - self.pos:
            raise self.fail(f"{what} would run past the end of the file (at byte {self.pos})")
        start, self.pos = self.pos, self.pos + size
        return start

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack_from(self.endian + fmt, self.data, self.take(size, what))[0]

    def text(self, length: int, what: str) -> str:
        start = self.take(length, f"{what} ({length} bytes)")
        return bytes(self.data[start : start + length]).decode("utf-8", "replace")

    def string(self, what: str) -> str | None:
        """A string value, kept when short, else skipped (None)."""
        length = self.scalar("Q", f"the length of {what}")
        if length <= MAX_KEPT_STRING:
            return self.text(length, what)
        self.take(length, f"{what} ({length} bytes)")
        return None

    def name(self, what: str) -> str:
        length = self.scalar("Q", f"the length of {what}")
        if length > MAX_GGUF_NAME:
            raise self.fail(f"{what} is {length} bytes long; names are at most {MAX_GGUF_NAME}")
        return self.text(length, what)

    def skip_strings(self, count: int, what: str) -> None:
        """Walk past `count` strings in one tight loop: a tokenizer's vocabulary is walked, never built."""
        unpack, data, end, pos = struct.Struct(self.endian + "Q").unpack_from, self.data, len(self.data), self.pos
        for _ in range(count):
            if pos + 8 > end:
                break
            pos += 8 + unpack(data, pos)[0]
        else:
            if pos <= end:
                self.pos = pos
                return
        raise self.fail(f"{what} ({count} strings) runs past the end of the file")

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        """A metadata value; arrays are walked past (within the budget) and give None."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY:
            raise self.fail(f"{what} has value type {kind}, which GGUF does not define")
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"{what} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        item, count = self.scalar("I", f"the type of {what}"), self.scalar("Q", f"the length of {what}")
        self.elements += count
        if self.elements > MAX_METADATA_ELEMENTS:
            raise self.fail(f"its metadata arrays hold more than {MAX_METADATA_ELEMENTS} elements, more than a rerun walks (at array {what})")
        if item in _SCALARS:
            self.take(count * struct.calcsize(_SCALARS[item]), f"{what} ({count} elements)")
        elif item == _STRING:
            self.skip_strings(count, what)
        else:
            for _ in range(count):
                self.value(item, f"an element of {what}", depth + 1)
        return None


def read_gguf_header(path: Path) -> GGUFHeader:
    """The GGUF's scalar metadata and tensor directory, every count and offset checked."""
    try:
        with open_regular_file(path) as file:
            size = os.fstat(file.fileno()).st_size
            if size < 24:
                raise GGUFFileError(f"{path}: not a usable GGUF (only {size} bytes, shorter than a GGUF header)")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _walk_header(_Walk(path, data))
    except OSError as exc:
        raise GGUFFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _walk_header(walk: _Walk) -> GGUFHeader:
    if bytes(walk.data[:4]) != b"GGUF":
        raise walk.fail("it does not start with the GGUF magic")
    walk.pos = 4
    version = walk.scalar("I", "the version")
    if version & 0xFFFF == 0:
        walk.endian, version = ">", int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in GGUF_VERSIONS:
        raise walk.fail(f"version {version}; a rerun reads versions {' and '.join(map(str, GGUF_VERSIONS))}")
    n_tensors, n_kv = walk.scalar("Q", "the tensor count"), walk.scalar("Q", "the metadata count")
    left = len(walk.data) - walk.pos
    if n_kv > left // 13 or n_tensors > min(MAX_TENSORS, left // 24):
        raise walk.fail(f"it declares {n_kv} metadata entries and {n_tensors} tensors, more than its {len(walk.data)} bytes can hold")
    metadata: dict[str, Any] = {}
    for number in range(n_kv):
        key = walk.name(f"metadata key {number}")
        value = walk.value(walk.scalar("I", f"the type of {key}"), key)
        if value is not None:
            metadata[key] = value
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise walk.fail(f"general.alignment is {alignment!r}, not a power of two")
    infos = [_tensor_info(walk, number) for number in range(n_tensors)]
    data_start = -(-walk.pos // alignment) * alignment
    tensors: dict[str, GGUFTensor] = {}
    for name, kind, dims, offset in infos:
        if name in tensors:
            raise walk.fail(f"tensor {name} appears twice")
        tensors[name] = _placed(walk, name, kind, dims, offset, data_start, alignment)
    return GGUFHeader(walk.path, metadata, tensors)


def _tensor_info(walk: _Walk, number: int) -> tuple[str, int, tuple[int, ...], int]:
    name = walk.name(f"the name of tensor {number}")
    n_dims = walk.scalar("I", f"the dimension count of {name}")
    if n_dims > GGML_MAX_DIMS:
        raise walk.fail(f"tensor {name} has {n_dims} dimensions; GGML has at most {GGML_MAX_DIMS}")
    dims = tuple(walk.scalar("Q", f"the dimensions of {name}") for _ in range(n_dims))
    return name, walk.scalar("I", f"the type of {name}"), dims, walk.scalar("Q", f"the offset of {name}")


def _placed(walk: _Walk, name: str, kind: int, dims: tuple[int, ...], offset: int, data_start: int, alignment: int) -> GGUFTensor:
    """The tensor with its byte size, refused unless its type is known and its bytes lie aligned inside the file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except ValueError:
        raise walk.fail(f"tensor {name} has GGML type {kind}, which the gguf package does not know") from None
    elements = 1
    for dim in dims:
        elements *= dim
    if dims and dims[0] % block:
        raise walk.fail(f"tensor {name}'s rows of {dims[0]} are not whole blocks of {block}")
    nbytes = elements // block * block_bytes
    if offset % alignment or data_start + offset + nbytes > len(walk.data):
        raise walk.fail(f"tensor {name} ({nbytes} bytes at data offset {offset}) is unaligned or runs past the end of the file")
    return GGUFTensor(name, kind, dims, data_start + offset, nbytes)


def read_gguf_tensor(header: GGUFHeader, tensor: GGUFTensor) -> np.ndarray:
    """The tensor's bytes as GGUFReader shapes them: float32/float16 values, BF16 as uint16 bits,
    other types as uint8 rows of blocks (what gguf.quants.dequantize takes)."""
    from gguf import GGMLQuantizationType

    try:
        with open_regular_file(header.path) as file:
            raw = np.fromfile(file, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset)
    except OSError as exc:
        raise GGUFFileError(f"{header.path}: cannot be read ({exc.strerror or exc})") from None
    if raw.size != tensor.nbytes:
        raise GGUFFileError(f"{header.path}: not a usable GGUF (tensor {tensor.name} is cut short; the file changed since it was read)")
    shape = tuple(reversed(tensor.dims))
    views = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.BF16: np.uint16}
    view = views.get(GGMLQuantizationType(tensor.ggml_type))
    if view is not None:
        return raw.view(view).reshape(shape)
    return raw.reshape(*shape[:-1], -1) if shape else raw


def _scalars(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, (bool, int, float, str))}


def hf_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's scalars; a multimodal model keeps its language model's in `text_config`,
    which fill what the top level lacks (the rerun recomputes the language model)."""
    text = config.get("text_config")
    return {**(_scalars(text) if isinstance(text, Mapping) else {}), **_scalars(config)}


def gguf_config(path: Path) -> dict[str, Any]:
    """The GGUF's hyperparameters under their config.json names; keys the file lacks are absent."""
    metadata = read_gguf_header(path).metadata
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelConfigError(f"{path}: GGUF metadata has no general.architecture")
    found = {name: metadata[f"{arch}.{key}"] for name, key in GGUF_KEYS.items() if f"{arch}.{key}" in metadata}
    return {"model_type": arch, **_scalars(found)}


def weights_file_config(weights: Path) -> dict[str, Any]:
    """The config of the model whose weights are `weights`: a GGUF's metadata, or the config.json
    beside a safetensors file; {} when there is none to read."""
    if weights.suffix == ".gguf":
        return gguf_config(weights) if weights.is_file() else {}
    beside = weights.parent / "config.json"
    if not beside.exists():
        return {}
    try:
        loaded = json.loads(read_side_file(beside, MAX_CONFIG_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelConfigError(f"{beside}: cannot be read as JSON ({type(exc).__name__}: {exc})") from None
    return hf_config(loaded) if isinstance(loaded, dict) else {}
