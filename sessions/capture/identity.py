"""Content identity of a capture: what a saved session and the result caches recognise a capture by.

A session points at captures by path; between sessions files get moved, handed to a
colleague, or overwritten by a fresh run under the same name. Showing an old bookmark on
new data would be a silent lie, so every capture a session names carries the identity it
had when it was added, and that identity is checked before any of its data is shown.

Identity is size + mtime (a cheap hint) and a SHA-256 over the root attributes and the
index table. Tensor bytes are not hashed: captures run to gigabytes, and the index already
changes with any new run (per-record timestamps, creation time, shapes, kernel ids), while
the size catches tensor data of another length. Bytes edited in place at the same size, the
index kept, are not caught (docs/sessions.md). A changed mtime alone is not a change of content.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sessions.capture.reader import Capture

IDENTITY_DOMAIN = b"parity-xray capture identity 1\0"
"""Prefix of every hashed stream, so a change of what is hashed can never collide with this one."""


@dataclass(frozen=True)
class CaptureIdentity:
    size: int
    mtime_ns: int
    sha256: str
    """Hex SHA-256 of the root attributes and the index table."""

    def same_content(self, other: CaptureIdentity) -> bool:
        """Equal content; the mtime is left out because copying or touching a file changes it."""
        return self.size == other.size and self.sha256 == other.sha256

    @property
    def content_key(self) -> str:
        """A key for caches of results computed from this capture (mtime-free, like `same_content`)."""
        return f"{self.size}:{self.sha256}"

    def differences(self, current: CaptureIdentity) -> list[str]:
        """What changed from this (saved) identity to the current one, in words."""
        found = []
        if self.size != current.size:
            found.append(f"size {self.size} -> {current.size} bytes")
        if self.sha256 != current.sha256:
            found.append(f"index/attribute hash {self.sha256[:12]} -> {current.sha256[:12]}")
        return found


def identity_of_capture(capture: Capture) -> CaptureIdentity:
    """Identity of an already open capture: hashing the same handle that will be read avoids a swap in between."""
    stat = os.stat(capture.path)
    digest = hashlib.sha256(IDENTITY_DOMAIN)
    meta = capture.meta.as_dict()
    if not meta["batch_stacked"]:
        del meta["batch_stacked"]  # a field newer than saved sessions: their captures keep the identity they saved
    root = {"meta": meta, "complete": capture.complete}
    digest.update(json.dumps(root, sort_keys=True, ensure_ascii=True).encode("ascii"))
    digest.update(b"\0")
    # Hashed in place: a copy of a real model's 115 MB index held the interpreter lock (and a
    # window's event loop) for 0.13 s; hashing a buffer this large releases it.
    digest.update(np.ascontiguousarray(capture.index).view(np.uint8))
    return CaptureIdentity(size=stat.st_size, mtime_ns=stat.st_mtime_ns, sha256=digest.hexdigest())


def identity_of_file(path: str | Path) -> CaptureIdentity:
    """Identity of the capture at `path`; raises `CaptureError` when it is not a readable capture."""
    # Imported here so that opening a session file (and the crash-recovery prompt at start-up)
    # does not load HDF5; only touching a capture does.
    from sessions.capture.opening import open_capture

    with open_capture(path) as capture:
        return identity_of_capture(capture)
