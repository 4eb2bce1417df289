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

Every problem is a `CaptureError` naming the manifest file and the entry as a JSON path names it
(`entries[1] ('Qcur-0')`, counted from 0 as the list's own index): a multi-step manifest repeats
names, and "entry 1" read as the first entry to some and the second to others.
The manifest comes from someone else's engine or CI: every value is checked here, against what
the capture format can hold, so that a bad one is refused before the output exists instead of
failing half-way through writing it, or producing a capture that `validate` refuses.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sessions.bits.dtypes import LOGICAL_DTYPES
from sessions.capture import format as cf
from sessions.capture.hdf5_safety import printable
from sessions.capture.pack_layout import MAX_ELEMENTS
from sessions.capture.reader import CaptureError
from sessions.capture.text_fields import control_character
from sessions.side_file import (
    MAX_JSON_DEPTH,
    JsonTooDeep,
    load_json,
    parse_problem,
    read_side_file,
)

DEFAULT_SEGMENT = "prefill"
ENTRY_KEYS = {
    "name", "file", "key", "dtype", "shape", "step", "segment", "layer", "order",
    "kernel_id", "contract_id", "effective_contract_id",
}
TOKEN_KEYS = {"step", "segment", "token_id", "is_stop"}
META_KEYS = {"role", "engine_name", "engine_version", "engine_commit", "model_id", "weights_hash", "device", "compiler", "prompt", "seed", "provenance"}
MAX_MANIFEST_BYTES = 64 * 1024**2
"""One entry per dumped tensor, a few hundred bytes each: a long multi-step dump is a few MB, and
64 MiB is far beyond it; a device or a huge file is refused before it is read whole."""
MANIFEST_DEPTH = MAX_JSON_DEPTH + 2
"""A manifest's provenance sits two levels down ({"meta": {"provenance": ...}}): it may nest as
deep as a capture's provenance may."""
MAX_STEP = int(np.iinfo(cf.INDEX_DTYPE["step"]).max)
MAX_LAYER = int(np.iinfo(cf.INDEX_DTYPE["layer"]).max)
MAX_INT64 = int(np.iinfo(np.int64).max)
"""The widest integers the capture stores (the index's shape, a token id, the seed); also the
largest order, so that every number a manifest gives fits the file it describes."""
_SHOWN_CHARS = 80
"""How much of a refused value a message quotes: a 10 MB string must not become a 10 MB message."""

Fail = Callable[[str], CaptureError]
_LAYER_PATTERNS = (re.compile(r"(?:^|\.)(?:layers|blk|h|block|blocks)\.(\d+)(?:\.|$)"), re.compile(r"-(\d+)$"))


def infer_layer(name: str) -> int:
    """The layer a conventional tensor name carries (`model.layers.3.x`, `blk.3.x`, `Qcur-3`), else
    -1. A number past what the index stores (`x-99999999999`) is no layer: it ended the import in
    an OverflowError."""
    for pattern in _LAYER_PATTERNS:
        found = pattern.search(name)
        if found and int(found.group(1)) <= MAX_LAYER:
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
        return f"entries[{self.position}] ({self.name!r})"


@dataclass
class Manifest:
    path: Path
    entries: list[Entry]
    meta: dict[str, Any] = field(default_factory=dict)
    tokens: list[dict[str, Any]] = field(default_factory=list)


def failing(path: Path, location: str) -> Fail:
    """A `fail` that places its problem at `location` in the manifest."""
    return lambda problem: CaptureError(path, location, problem)


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}..."


def _int(value: Any, what: str, minimum: int, maximum: int, fail: Fail) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise fail(f"{what} must be an integer, not {_shown(value)}")
    if value < minimum:
        raise fail(f"{what} must be >= {minimum}, not {_shown(value)}")
    if value > maximum:
        raise fail(f"{what} must be <= {maximum} (the capture format's largest), not {_shown(value)}")
    return value


def _text(value: Any, what: str, limit: int, fail: Fail, *, multiline: bool = False) -> str:
    """A text value the capture can hold, and that `validate` accepts: within its field's bytes and,
    unless it may span lines (the prompt), free of control characters, which would reach the
    terminal of whoever reads a report."""
    if not isinstance(value, str):
        raise fail(f"{what} must be a string, not {_shown(value)}")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        raise fail(f"{what} is not Unicode text (it holds a lone surrogate: '{printable(value)}')") from None
    if len(encoded) > limit:
        raise fail(f"{what} is longer than the capture format's {limit} bytes")
    control = None if multiline else control_character(value)
    if control is not None:
        raise fail(f"{what} holds a control character ({printable(control)} in '{printable(value)}')")
    return value


def meta_value(key: str, value: Any, fail: Fail) -> Any:
    """`value` for the CaptureMeta field `key` if the capture's root attributes can hold it as `validate` reads them."""
    if key == "role":
        if value not in cf.ROLES:
            raise fail(f"role must be one of {', '.join(cf.ROLES)}, not {_shown(value)}")
        return value
    if key == "seed":
        return _int(value, "seed", -MAX_INT64 - 1, MAX_INT64, fail)
    if key == "provenance":
        if not isinstance(value, dict):
            raise fail(f"provenance must be a JSON object, not {_shown(value)}")
        size = len(json.dumps(value, sort_keys=True).encode("utf-8"))
        if size > cf.ATTRIBUTE_TABLE_BYTES:
            raise fail(f"provenance is {size} bytes as JSON, over the {cf.ATTRIBUTE_TABLE_BYTES} an attribute holds")
        return value
    return _text(value, key, cf.ATTRIBUTE_TABLE_BYTES, fail, multiline=key in cf.MULTILINE_STRING_ATTRS)


def _meta(raw: Any, path: Path) -> dict[str, Any]:
    if not isinstance(raw, dict) or set(raw) - META_KEYS:
        raise CaptureError(path, "meta", f"must be an object with keys among {', '.join(sorted(META_KEYS))}")
    return {key: meta_value(key, value, failing(path, f"meta {key!r}")) for key, value in raw.items()}


def _token(raw: Any, number: int, path: Path) -> dict[str, Any]:
    """A tokens row with the types and ranges of the capture's token table."""
    fail = failing(path, f"tokens[{number}]")
    if not isinstance(raw, dict) or not {"step", "token_id"} <= set(raw):
        raise fail("needs at least 'step' and 'token_id'")
    unknown = sorted(set(raw) - TOKEN_KEYS)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(TOKEN_KEYS))}")
    is_stop = raw.get("is_stop", False)
    if not isinstance(is_stop, bool):
        raise fail(f"is_stop must be true or false, not {_shown(is_stop)}")
    return {
        "step": _int(raw["step"], "step", 0, MAX_STEP, fail),
        # The entries' default: a row without one had segment "", and report keyed its logits `0::-1:logits`.
        "segment": _text(raw.get("segment", DEFAULT_SEGMENT), "segment", cf.TOKENS_DTYPE["segment"].itemsize, fail),
        "token_id": _int(raw["token_id"], "token_id", 0, MAX_INT64, fail),
        "is_stop": is_stop,
    }


def _entry(raw: Any, position: int, path: Path, *, need_file: bool) -> Entry:
    name = raw.get("name") if isinstance(raw, dict) else None
    label = f"entries[{position}]" + (f" ({name[:64]!r})" if isinstance(name, str) else "")
    fail = failing(path, label)

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
    if dtype is not None and (not isinstance(dtype, str) or dtype not in LOGICAL_DTYPES):
        raise fail(f"dtype {_shown(dtype)} is not a capture dtype ({', '.join(sorted(LOGICAL_DTYPES))})")
    shape = raw.get("shape")
    if shape is not None:
        if not isinstance(shape, list) or len(shape) > cf.MAX_NDIM:
            raise fail(f"shape must be a list of at most {cf.MAX_NDIM} sizes, not {_shown(shape)}")
        shape = tuple(_int(d, "each shape size", 0, MAX_INT64, fail) for d in shape)
        if math.prod(d for d in shape if d) > MAX_ELEMENTS:
            raise fail(f"shape {list(shape)}'s non-zero sizes hold more than 2**{MAX_ELEMENTS.bit_length() - 1} elements, the most a capture holds")
    layer = _int(raw["layer"], "layer", -1, MAX_LAYER, fail) if "layer" in raw else infer_layer(name)
    return Entry(
        name=name,
        position=position,
        file=file,
        key=_text(raw["key"], "'key'", 4096, fail) if "key" in raw else None,
        dtype=dtype,
        shape=shape,
        step=_int(raw.get("step", 0), "step", 0, MAX_STEP, fail),
        segment=_text(raw.get("segment", DEFAULT_SEGMENT), "segment", 16, fail) or DEFAULT_SEGMENT,
        layer=layer,
        order=_int(raw.get("order", position), "order", 0, MAX_INT64, fail),
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
        meta = _meta(data.get("meta", {}), path)
        tokens = data.get("tokens", [])
        if not isinstance(tokens, list):
            raise CaptureError(path, "tokens", "must be a list of {step, segment, token_id, is_stop} objects")
        tokens = [_token(row, number, path) for number, row in enumerate(tokens)]
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
        text = read_side_file(path, MAX_MANIFEST_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise CaptureError(path, "file", "manifest does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CaptureError(path, "file", f"cannot read the manifest ({exc})") from None
    try:
        data = load_json(text, MANIFEST_DEPTH)
    except JsonTooDeep as exc:
        raise CaptureError(path, "file", str(exc)) from None
    except json.JSONDecodeError as exc:
        raise CaptureError(path, f"line {exc.lineno} column {exc.colno}", f"not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise CaptureError(path, "file", f"not valid JSON ({parse_problem(exc)})") from None
    return parse_manifest(data, path, need_file=need_file)


def default_manifest(names: list[str], path: Path) -> Manifest:
    """For a safetensors or .npz file with no manifest: every array in step 0, in the order of
    `names`, layer read from the name. A name longer than a record's is refused, not cut: two
    cut names could become one, and a cut `-N` loses the layer."""
    if not names:
        raise CaptureError(path, "file", "holds no arrays, so there is nothing to import")  # not "entries: the list is empty" of a manifest never given
    for name in names:
        if len(name.encode("utf-8", "surrogatepass")) > cf.INDEX_DTYPE["name"].itemsize:
            raise CaptureError(
                path, f"array {name[:64]!r}...",
                f"its name is longer than the {cf.INDEX_DTYPE['name'].itemsize} bytes a record's name holds; "
                "give a manifest (--manifest) whose entry names it ('name') and picks it ('key')",
            )
    return parse_manifest([{"name": n, "key": n} for n in names], path, need_file=False)
