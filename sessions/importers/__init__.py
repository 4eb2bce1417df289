"""Importers: turn what engines already dump (safetensors, .npz, .npy/.bin + manifest) into captures.

`iter_import(kind, source, out, ...)` is the one entry point; docs/importers.md has a worked
example of each kind. Records are written in (step, order) order, one token step at a time,
so the result is an ordinary capture that `validate`, `report` and the viewer accept.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sessions.atomic_write import folder_problem, link_problem
from sessions.capture.meta import CaptureMeta
from sessions.capture.reader import CaptureError
from sessions.capture.writer import CaptureWriter
from sessions.importers.manifest import Manifest, failing, load_manifest, meta_value
from sessions.importers.sources import (
    ImportedArray,
    from_directory,
    from_npz,
    from_safetensors,
)
from sessions.progress import Progress, ProgressGenerator

KINDS = ("safetensors", "npz", "dir")
MANIFEST_NAME = "manifest.json"


def _open(kind: str, source: Path, manifest_path: Path | None) -> tuple[Manifest, Iterator[ImportedArray]]:
    if kind not in KINDS:
        raise ValueError(f"unknown import kind {kind!r}; known: {', '.join(KINDS)}")
    if not source.exists():
        raise CaptureError(source, "file", "does not exist")
    if kind == "dir":
        if not source.is_dir():
            raise CaptureError(source, "file", "is not a directory (import dir takes a directory of .npy/.bin files)")
        manifest = load_manifest(manifest_path or source / MANIFEST_NAME, need_file=True)
        return manifest, from_directory(manifest)
    if not source.is_file():
        raise CaptureError(source, "file", f"is not a regular file (import {kind} takes one file)")
    manifest = load_manifest(manifest_path, need_file=False) if manifest_path else None
    opener = from_safetensors if kind == "safetensors" else from_npz
    return opener(source, manifest)


def _meta(manifest: Manifest, overrides: dict[str, Any], source: Path, kind: str, manifest_file: Path | None) -> CaptureMeta:
    """The capture's meta: the manifest's (checked when it was read), the caller's overrides
    checked the same way, and where it was imported from added to the provenance: resolved, as
    the recorders write the files they read, and the manifest only when one was given (the
    source's own file was named as its manifest)."""
    given = {k: meta_value(k, v, failing(source, f"option {k!r}")) for k, v in overrides.items() if v is not None}
    fields = {**manifest.meta, **given}
    provenance = {**fields.pop("provenance", {}), "imported_from": str(source.resolve()), "import_kind": kind}
    if manifest_file is not None:
        provenance["manifest"] = str(manifest_file.resolve())
    meta_value("provenance", provenance, failing(manifest.path, "meta 'provenance'"))
    fields.setdefault("role", "native")
    try:
        return CaptureMeta(provenance=provenance, **fields)
    except TypeError as exc:
        raise CaptureError(manifest.path, "meta", str(exc)) from None


def iter_import(
    kind: str, source: str | Path, out: str | Path, *, manifest: str | Path | None = None, meta: dict[str, Any] | None = None
) -> ProgressGenerator[Path]:
    """Import `source` into the capture `out`; yields Progress per tensor, returns `out`.

    The manifest is checked before `out` is created; the arrays are read one by one, and a
    bad one stops the import, and `out` is never made. An existing `out` is refused.
    """
    source, out = Path(source), Path(out)
    if out.exists():
        raise CaptureError(out, "file", "already exists; importing never overwrites a file")
    linked = link_problem(out)  # a link to nothing: the capture would replace the link, not be written where it leads
    if linked is not None:
        raise CaptureError(out, "file", linked)
    problem = folder_problem(out)
    if problem is not None:
        raise CaptureError(out, "file", problem)
    manifest_file = Path(manifest) if manifest else None
    parsed, arrays = _open(kind, source, manifest_file)
    capture_meta = _meta(parsed, meta or {}, source, kind, manifest_file)
    yield from _write(parsed, arrays, capture_meta, out)  # `out` appears only once complete (complete_only)
    return out


def _write(parsed: Manifest, arrays: Iterator[ImportedArray], capture_meta: CaptureMeta, out: Path) -> ProgressGenerator[None]:
    total = len(parsed.entries)
    with CaptureWriter(out, capture_meta, complete_only=True) as writer:
        step = None
        for done, item in enumerate(arrays, start=1):
            entry = item.entry
            if step is not None and entry.step != step:
                writer.end_step()
            step = entry.step
            writer.add_tensor(
                entry.name,
                item.bits,
                step=entry.step,
                segment=entry.segment,
                layer=entry.layer,
                dtype=item.dtype,
                logical_shape=item.logical_shape,
                kernel_id=entry.kernel_id,
                contract_id=entry.contract_id,
                effective_contract_id=entry.effective_contract_id,
            )
            yield Progress(done, total, entry.name)
        for number, row in enumerate(parsed.tokens):
            try:
                writer.add_token(**row)
            except ValueError as exc:
                raise CaptureError(parsed.path, f"tokens row {number}", str(exc)) from None
