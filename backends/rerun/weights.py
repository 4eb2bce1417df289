"""A rerun's weights: read from the capture (a record named like the weight) or from the
weights file it references or the user names (safetensors, or GGUF decoded with the gguf
package's dequantizers -- never `mx.load`, whose K-quant decode is wrong), and refused, by
file, tensor and reason, when no model could hold them.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from backends.recorders.model_config import (
    GGUFFileError,
    GGUFHeader,
    GGUFTensor,
    read_gguf_header,
    read_gguf_tensor,
)
from backends.rerun.inputs import (
    WEIGHT_NAMES,
    CapturedOps,
    RerunInputError,
    bits_to_mx,
    referenced_weights,
)
from sessions.bits.dtypes import logical_dtype
from sessions.printable import printable
from sessions.side_file import file_kind


@dataclass(frozen=True)
class StoredWeight:
    """A weight as its GGUF file stores it: the GGML type and the raw bytes (quantized blocks)."""

    ggml_type: str
    """GGML type name, e.g. F32, F16, BF16, Q8_0, Q4_K."""
    raw: np.ndarray
    rows: int


FLOAT_WEIGHTS = (mx.float32, mx.float16, mx.bfloat16)
"""What a weight may be once read: an integer or float8 weight would be multiplied as numbers
it does not mean, and the rerun's "does not reproduce" would read as a finding."""
NOT_WEIGHT_GGML_TYPES = ("I8", "I16", "I32", "I64", "F64")
"""GGML types that hold integers (or float64, which no engine computes in), not a model's weights."""
NORM_WEIGHTS = ("attn_norm", "ffn_norm", "final_norm")
HEAD_NORM_WEIGHTS = ("q_norm", "k_norm")


def _not_a_regular_file(path: Path) -> str | None:
    """What `path` is when it is not a regular file with bytes in it ("is a directory", "is
    empty"), without opening it: opening a FIFO blocks until a writer comes, and /dev/zero never ends."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISREG(status.st_mode):
        return f"is {file_kind(status.st_mode)}, not a regular file"
    return "is empty (0 bytes)" if status.st_size == 0 else None


def named_weights_problem(weights: str | None) -> str | None:
    """Why `--weights` names no weights file, said before any work: read only when an op needs a
    weight, a missing file went unmentioned by a diagnosis that needed none, and exited 0."""
    if weights is None:
        return None
    problem = _not_a_regular_file(Path(weights)) or _not_weights(Path(weights))
    return None if problem is None else f"weights file {printable(weights)} (named for this rerun) {problem}"


SAFETENSORS_HEADER_MAX = 100 << 20
"""The largest safetensors header believed (the format's own limit is 100 MB)."""


def _safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header; ValueError saying why it has none a reader takes (a
    length past the file or the format's limit, text that is not a JSON object), OSError when it
    cannot be read."""
    with path.open("rb") as file:
        head = file.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 1 < length <= min(SAFETENSORS_HEADER_MAX, path.stat().st_size - 8):
            raise ValueError(f"it begins {head!r}")
        try:
            header = json.loads(file.read(length))
        except (ValueError, RecursionError):
            raise ValueError("its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return header


def _not_weights(path: Path) -> str | None:
    """Why a regular file cannot be the weights it is taken for (GGUF when named *.gguf, else
    safetensors), from its first bytes: found only when an op needed a weight, a capture named
    as the weights left every op that takes one "undetermined" and exited 1, a finding, where
    the input was wrong."""
    gguf = path.suffix == ".gguf"
    taken = "GGUF" if gguf else "safetensors, which a weights file not named *.gguf is taken to be"
    try:
        if gguf:
            with path.open("rb") as file:
                head = file.read(8)
            return None if head[:4] == b"GGUF" else f"cannot be read as {taken} (it begins {head!r})"
        _safetensors_header(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    except ValueError as exc:
        return f"cannot be read as {taken} ({exc})"
    return None


def _safetensors_dtype(path: Path, name: str, fallback: str) -> str:
    """The dtype the safetensors header declares for `name` (mx.load reads float8 as uint8);
    `fallback` when the header says nothing readable (mx.load has already accepted it)."""
    try:
        declared = _safetensors_header(path)[name]["dtype"]
    except (OSError, ValueError, KeyError, TypeError):
        return fallback
    return declared if isinstance(declared, str) else fallback


def _shape_problem(op: str, shape: tuple[int, ...], width: int) -> str | None:
    """Why a weight of `shape` cannot be `op`'s for an input `width` wide, or None."""
    if op in NORM_WEIGHTS and shape != (width,):
        return f"{op} of a {width}-wide input needs [{width}]"
    if op in HEAD_NORM_WEIGHTS and (len(shape) != 1 or width % shape[0]):
        return f"{op} of a {width}-wide input needs [head_dim], a divisor of {width}"
    if op not in NORM_WEIGHTS + HEAD_NORM_WEIGHTS and (len(shape) != 2 or shape[1] != width):
        return f"{op} of a {width}-wide input needs [outputs, {width}]"
    return None


class WeightSource:
    """Weights by canonical op and layer: from capture records first, then the weights file.

    Records and files are untrusted: a weight is refused, naming the tensor and where it came
    from, unless it is a float tensor of the op's shape holding more than NaN."""

    def __init__(self, ops: CapturedOps, weights_path: Path | None = None) -> None:
        self.ops = ops
        self.named = weights_path is not None
        found = referenced_weights(ops.capture, weights_path)
        # Absolute: a saved rerun's provenance names it, and is read from another folder.
        self.path = found.absolute() if found is not None else None
        self._records = {r.name: r for r in ops.capture.records if r.name.endswith(".weight")}
        self._file: dict[str, mx.array] | None = None
        self._gguf: GGUFHeader | None = None
        self.read_from: list[str] = []
        """Where each weight taken so far came from, in order (a capture, a file's path): what a
        rerun says it used, and what its saved capture's provenance records."""

    def _origin(self) -> str:
        return "named for this rerun" if self.named else f"referenced by the {self.ops.side} capture"

    def describe(self) -> str:
        if self.path is None:
            return f"the {self.ops.side} capture's weight records (it references no weights file)"
        return f"{self.path.name} ({self._origin()})"

    def get(self, op: str, layer: int, width: int | None = None) -> mx.array:
        """`op`'s weight; with `width` (the input's last dimension), refused unless its shape fits."""
        names = [n.format(n=layer) for n in WEIGHT_NAMES[op]]
        found = self._from_records(names)
        if found is None and self.path is not None:
            found = self._from_file(names)
        if found is None:
            where = f"layer {layer} " if layer >= 0 else ""
            raise RerunInputError(
                f"{op} rerun needs the {where}weight ({' or '.join(names)}); neither the {self.ops.side} capture "
                f"nor {self.path if self.path is not None else 'a referenced weights file'} holds it"
                + ("" if self.named else " (`--weights FILE` names the file that does)")
            )
        name, weight, source = found
        _check_weight(op, name, weight, source, width)
        self.read_from.append(source)
        return weight

    def _from_records(self, names: list[str]) -> tuple[str, mx.array, str] | None:
        for name in names:
            record = self._records.get(name)
            if record is not None:
                return name, self._from_record(record), f"the {self.ops.side} capture"
        return None

    def _from_record(self, record: Any) -> mx.array:
        if logical_dtype(record.dtype).is_quantized:
            values = self.ops.capture.read_values(record)
            return mx.array(np.ascontiguousarray(values, dtype=np.float32))
        if record.dtype not in ("bfloat16", "float16", "float32"):
            raise RerunInputError(_dtype_message(record.name, f"the {self.ops.side} capture", record.dtype))
        return bits_to_mx(self.ops.capture.read_bits(record), record.dtype)

    def _check_path(self) -> Path:
        assert self.path is not None
        problem = _not_a_regular_file(self.path)
        if problem is not None:
            named = "" if self.named else " (`--weights FILE` names another)"
            raise RerunInputError(f"weights file {self.path} ({self._origin()}) {problem}{named}")
        return self.path

    def _from_file(self, names: list[str]) -> tuple[str, mx.array, str] | None:
        path = self._check_path()
        if path.suffix == ".gguf":
            return self._from_gguf(names)
        if self._file is None:
            try:
                self._file = dict(mx.load(str(path)).items())
            except (OSError, ValueError, RuntimeError) as exc:
                raise RerunInputError(
                    f"weights file {path} ({self._origin()}) cannot be read as safetensors, which a weights file "
                    f"not named *.gguf is taken to be ({exc})"
                ) from None
        name = next((n for n in names if n in self._file), None)
        if name is None:
            return None
        weight = self._file[name]
        if weight.dtype not in FLOAT_WEIGHTS:
            raise RerunInputError(_dtype_message(name, str(path), _safetensors_dtype(path, name, _dtype_name(weight))))
        return name, weight, str(path)

    def stored(self, op: str, layer: int) -> StoredWeight | None:
        """The weight's stored form when it comes from a GGUF file; None for float records or safetensors."""
        if self.path is None or self.path.suffix != ".gguf" or _not_a_regular_file(self.path) is not None:
            return None
        tensor = self._gguf_tensor([n.format(n=layer) for n in WEIGHT_NAMES[op]])
        if tensor is None:
            return None
        raw = self._read(tensor)
        return StoredWeight(_ggml_name(tensor.ggml_type), raw, int(raw.shape[0]) if raw.ndim > 1 else 1)

    def _gguf_tensor(self, names: list[str]) -> GGUFTensor | None:
        if self._gguf is None:
            try:
                self._gguf = read_gguf_header(self._check_path())
            except GGUFFileError as exc:
                raise RerunInputError(str(exc)) from None
        return next((self._gguf.tensors[n] for n in names if n in self._gguf.tensors), None)

    def _read(self, tensor: GGUFTensor) -> np.ndarray:
        assert self._gguf is not None
        try:
            return read_gguf_tensor(self._gguf, tensor)
        except GGUFFileError as exc:
            raise RerunInputError(str(exc)) from None

    def _from_gguf(self, names: list[str]) -> tuple[str, mx.array, str] | None:
        """A GGUF tensor decoded by the gguf package (quantized blocks included), as float32 or its float type."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        tensor = self._gguf_tensor(names)
        if tensor is None:
            return None
        kind = GGMLQuantizationType(tensor.ggml_type)
        if kind.name in NOT_WEIGHT_GGML_TYPES:
            raise RerunInputError(_dtype_message(tensor.name, str(self.path), kind.name))
        raw = self._read(tensor)
        if kind == GGMLQuantizationType.BF16:
            return tensor.name, mx.array(raw).view(mx.bfloat16), str(self.path)
        if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            return tensor.name, mx.array(raw), str(self.path)
        try:
            return tensor.name, mx.array(dequantize(raw, kind).astype(np.float32)), str(self.path)
        except NotImplementedError:
            raise RerunInputError(f"{self.path}: tensor {tensor.name} is stored as {kind.name}, which the gguf package cannot decode") from None


def _ggml_name(kind: int) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(kind).name


def _dtype_name(array: mx.array) -> str:
    return str(array.dtype).removeprefix("mlx.core.")


def _dtype_message(tensor: str, source: str, dtype: str) -> str:
    return f"{source}: weight {tensor} is stored as {dtype}; a rerun computes with float weights (float32, float16, bfloat16 or GGUF quantized blocks)"


def _check_weight(op: str, name: str, weight: mx.array, source: str, width: int | None) -> None:
    """Refuse a weight no model could hold: one of the wrong shape would fail inside MLX with no
    file named, and an all-NaN one would make every rerun "not reproduce" -- no trained
    checkpoint has an all-NaN tensor, so it is a broken file, not a finding."""
    if width is not None:
        problem = _shape_problem(op, tuple(weight.shape), width)
        if problem is not None:
            raise RerunInputError(f"{source}: weight {name} has shape {list(weight.shape)}; {problem}")
    if weight.size == 0:
        raise RerunInputError(f"{source}: weight {name} has no elements (shape {list(weight.shape)})")
    if mx.all(mx.isnan(weight)).item():
        raise RerunInputError(f"{source}: weight {name} is all NaN, which no trained checkpoint holds: the file is broken")
