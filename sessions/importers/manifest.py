"""The JSON manifest that tells an importer what each dumped array is.

Engines dump tensors with no notion of token steps, layers or execution order; the manifest
adds them. One entry per tensor:

    {"name": "Qcur-0", "file": "q0.bin", "dtype": "float32", "shape": [7, 768],
     "step": 0, "segment": "prefill", "layer": 0, "order": 12}

`file` is needed by the directory importer only; `key` picks an array inside a safetensors or
.npz file (default: the name). `dtype` and `shape` are required for raw `.bin` files and, when
given for typed arrays, must agree with them (a same-width `dtype` reinterprets the bits, so a
uint16 array can be declared `bfloat16`). The top level is a list of entries, or an object with
`entries`, optional `meta` (CaptureMeta fields) and optional `tokens` rows.

Every problem is a `CaptureError` naming the manifest file and the entry (number and name).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions.bits.dtypes import LOGICAL_DTYPES
from sessions.capture import format as cf
from sessions.capture.reader import CaptureError

DEFAULT_SEGMENT = "prefill"
ENTRY_KEYS = {
    "name", "file", "key", "dtype", "shape", "step", "segment", "layer", "order",
    "kernel_id", "contract_id", "effective_contract_id",
}
META_KEYS = {"role", "engine_name", "engine_version", "engine_commit", "model_id", "weights_hash", "device", "compiler", "prompt", "seed", "provenance"}
_LAYER_PATTERNS = (re.compile(r"(?:^|\.)(?:layers|blk|h|block|blocks)\.(\d+)(?:\.|$)"), re.compile(r"-(\d+)$"))


def infer_layer(name: str) -> int:
    """The layer a conventional tensor name carries (`model.layers.3.x`, `blk.3.x`, `Qcur-3`), else -1."""
    for pattern in _LAYER_PATTERNS:
        found = pattern.search(name)
        if found:
            return int(found.group(1))
    return -1


@dataclass(frozen=True)
class Entry:
    name: str
    position: int
    """The entry's place in the manifest (0-based), for messages and as the default order."""
    file: str | None = None
    key: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    step: int = 0
    segment: str = DEFAULT_SEGMENT
    layer: int = -1
    order: int = 0
    kernel_id: str = ""
    contract_id: str = ""
    effective_contract_id: str = ""

    @property
    def source_key(self) -> str:
        return self.key if self.key is not None else self.name

    def label(self) -> str:
        return f"entry {self.position} ({self.name!r})"


@dataclass
class Manifest:
    path: Path
    entries: list[Entry]
    meta: dict[str, Any] = field(default_factory=dict)
    tokens: list[dict[str, Any]] = field(default_factory=list)


def _int(value: Any, what: str, minimum: int, fail: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise fail(f"{what} must be an integer, not {json.dumps(value)}")
    if value < minimum:
        raise fail(f"{what} must be >= {minimum}, not {value}")
    return value


def _text(value: Any, what: str, limit: int, fail: Any) -> str:
    if not isinstance(value, str):
        raise fail(f"{what} must be a string, not {json.dumps(value)}")
    if len(value.encode("utf-8")) > limit:
        raise fail(f"{what} is longer than the capture format's {limit} bytes")
    return value


def _entry(raw: Any, position: int, path: Path, *, need_file: bool) -> Entry:
    name = raw.get("name") if isinstance(raw, dict) else None
    label = f"entry {position}" + (f" ({name!r})" if isinstance(name, str) else "")

    def fail(problem: str) -> CaptureError:
        return CaptureError(path, label, problem)

    if not isinstance(raw, dict):
        raise fail(f"must be a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - ENTRY_KEYS)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(ENTRY_KEYS))}")
    if "name" not in raw:
        raise fail("has no 'name'")
    name = _text(raw["name"], "'name'", 64, fail)
    if not name:
        raise fail("'name' is empty")
    if need_file and "file" not in raw:
        raise fail("has no 'file' (the directory importer needs one per entry)")
    file = _text(raw["file"], "'file'", 4096, fail) if "file" in raw else None
    if file is not None and (Path(file).is_absolute() or ".." in Path(file).parts):
        raise fail(f"'file' {file!r} must be a path inside the manifest's directory")
    dtype = raw.get("dtype")
    if dtype is not None and dtype not in LOGICAL_DTYPES:
        raise fail(f"dtype {json.dumps(dtype)} is not a capture dtype ({', '.join(sorted(LOGICAL_DTYPES))})")
    shape = raw.get("shape")
    if shape is not None:
        if not isinstance(shape, list) or len(shape) > cf.MAX_NDIM:
            raise fail(f"shape must be a list of at most {cf.MAX_NDIM} sizes, not {json.dumps(shape)}")
        shape = tuple(_int(d, "each shape size", 0, fail) for d in shape)
    layer = _int(raw["layer"], "layer", -1, fail) if "layer" in raw else infer_layer(name)
    return Entry(
        name=name,
        position=position,
        file=file,
        key=_text(raw["key"], "'key'", 4096, fail) if "key" in raw else None,
        dtype=dtype,
        shape=shape,
        step=_int(raw.get("step", 0), "step", 0, fail),
        segment=_text(raw.get("segment", DEFAULT_SEGMENT), "segment", 16, fail) or DEFAULT_SEGMENT,
        layer=layer,
        order=_int(raw.get("order", position), "order", 0, fail),
        kernel_id=_text(raw.get("kernel_id", ""), "kernel_id", 64, fail),
        contract_id=_text(raw.get("contract_id", ""), "contract_id", 64, fail),
        effective_contract_id=_text(raw.get("effective_contract_id", ""), "effective_contract_id", 64, fail),
    )


def parse_manifest(data: Any, path: Path, *, need_file: bool) -> Manifest:
    """A manifest from already-decoded JSON; `path` is named in every message."""
    path = Path(path)
    meta: dict[str, Any] = {}
    tokens: list[dict[str, Any]] = []
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"entries", "meta", "tokens"})
        if unknown:
            raise CaptureError(path, "top level", f"unknown key(s) {', '.join(unknown)}; known: entries, meta, tokens")
        if "entries" not in data:
            raise CaptureError(path, "top level", "has no 'entries' list")
        meta = data.get("meta", {})
        if not isinstance(meta, dict) or set(meta) - META_KEYS:
            raise CaptureError(path, "meta", f"must be an object with keys among {', '.join(sorted(META_KEYS))}")
        tokens = data.get("tokens", [])
        if not isinstance(tokens, list):
            raise CaptureError(path, "tokens", "must be a list of {step, segment, token_id, is_stop} objects")
        for number, row in enumerate(tokens):
            if not isinstance(row, dict) or not {"step", "token_id"} <= set(row):
                raise CaptureError(path, f"tokens row {number}", "needs at least 'step' and 'token_id'")
        data = data["entries"]
    if not isinstance(data, list):
        raise CaptureError(path, "top level", "must be a list of entries or an object with 'entries'")
    if not data:
        raise CaptureError(path, "entries", "the list is empty")
    entries = [_entry(raw, i, path, need_file=need_file) for i, raw in enumerate(data)]
    seen: dict[tuple[int, int], Entry] = {}
    for entry in entries:
        earlier = seen.get((entry.step, entry.order))
        if earlier is not None:
            raise CaptureError(path, entry.label(), f"step {entry.step} order {entry.order} is also given to {earlier.label()}")
        seen[(entry.step, entry.order)] = entry
    entries.sort(key=lambda e: (e.step, e.order))
    return Manifest(path, entries, meta, tokens)


def load_manifest(path: str | Path, *, need_file: bool) -> Manifest:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CaptureError(path, "file", "manifest does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CaptureError(path, "file", f"cannot read the manifest ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaptureError(path, f"line {exc.lineno} column {exc.colno}", f"not valid JSON ({exc.msg})") from None
    return parse_manifest(data, path, need_file=need_file)


def default_manifest(names: list[str], path: Path) -> Manifest:
    """For a safetensors or .npz file with no manifest: every array in step 0, file order,
    layer read from the name."""
    return parse_manifest([{"name": n[:64], "key": n} for n in names], path, need_file=False)
