"""Logical dtypes of captured tensors and how they are stored.

A capture keeps every bit an engine produced, so bfloat16 is stored as its uint16 bit
pattern and quantized blocks as raw bytes; the logical dtype travels beside the data and
decides how bits become values for display.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class LogicalDtype:
    name: str
    storage: np.dtype
    """The numpy dtype of the stored HDF5 dataset."""
    value: np.dtype | None
    """The numpy dtype whose values the bits encode, or None for quantized blocks."""
    ggml_type: str | None = None
    """The GGML quantization type name for block formats (decoded with the gguf package)."""

    @property
    def is_float(self) -> bool:
        return self.value is not None and self.value.kind == "f" or self.name == "bfloat16"

    @property
    def is_quantized(self) -> bool:
        return self.ggml_type is not None

    @property
    def bits(self) -> int:
        return self.storage.itemsize * 8


def _plain(name: str) -> LogicalDtype:
    dt = np.dtype(name)
    return LogicalDtype(name, dt, dt)


LOGICAL_DTYPES: dict[str, LogicalDtype] = {
    "bfloat16": LogicalDtype("bfloat16", np.dtype(np.uint16), np.dtype(ml_dtypes.bfloat16)),
    **{
        n: _plain(n)
        for n in (
            "float16",
            "float32",
            "float64",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "bool",
        )
    },
    **{
        q.lower(): LogicalDtype(q.lower(), np.dtype(np.uint8), None, q)
        for q in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")
    },
}

FLOAT_BIT_DTYPES: dict[str, np.dtype] = {
    "bfloat16": np.dtype(np.uint16),
    "float16": np.dtype(np.uint16),
    "float32": np.dtype(np.uint32),
    "float64": np.dtype(np.uint64),
}
"""Unsigned integer views of each float dtype, used for bit-pattern comparison."""


class UnknownDtypeError(ValueError):
    pass


def logical_dtype(name: str) -> LogicalDtype:
    try:
        return LOGICAL_DTYPES[name]
    except KeyError:
        raise UnknownDtypeError(
            f"unknown logical dtype {name!r}; known: {', '.join(sorted(LOGICAL_DTYPES))}"
        ) from None


def logical_name_of(array: np.ndarray) -> str:
    """The logical dtype name of a numpy array an engine hands to the writer."""
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        return "bfloat16"
    name = array.dtype.name
    if name not in LOGICAL_DTYPES:
        raise UnknownDtypeError(f"numpy dtype {array.dtype} has no capture dtype")
    return name


def to_storage(array: np.ndarray, logical: str) -> np.ndarray:
    """The array as stored bits: a bit-preserving view, never a value conversion."""
    ld = logical_dtype(logical)
    if array.dtype == ld.storage:
        return array
    if array.dtype.itemsize != ld.storage.itemsize:
        raise UnknownDtypeError(f"cannot store {array.dtype} as {logical}")
    return np.ascontiguousarray(array).view(ld.storage)


def quant_block_geometry(ggml_type: str) -> tuple[int, int]:
    """(elements, bytes) of one GGML block of this type."""
    from gguf import GGMLQuantizationType
    from gguf.constants import GGML_QUANT_SIZES

    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    return int(block), int(type_size)


def quantized_nbytes(ggml_type: str, logical_shape: tuple[int, ...]) -> int:
    """Bytes that GGML blocks of this type take for a tensor of this logical shape."""
    block, type_size = quant_block_geometry(ggml_type)
    if not logical_shape or logical_shape[-1] % block:
        raise ValueError(f"{ggml_type} needs a last dimension that is a multiple of {block}; shape is {logical_shape}")
    elements = 1
    for dim in logical_shape:
        elements *= dim
    return elements // block * type_size


def as_values(bits: np.ndarray, logical: str) -> np.ndarray:
    """Stored bits reinterpreted as values (bfloat16 via ml_dtypes); quantized blocks decoded."""
    ld = logical_dtype(logical)
    if ld.is_quantized:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        return dequantize(bits, GGMLQuantizationType[ld.ggml_type])
    return bits.view(ld.value)


def as_bit_pattern(bits: np.ndarray, logical: str) -> np.ndarray:
    """An unsigned-integer view for bitwise comparison (floats) or the bits as they are."""
    target = FLOAT_BIT_DTYPES.get(logical)
    return bits.view(target) if target is not None else bits
