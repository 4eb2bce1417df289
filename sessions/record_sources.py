"""Source tensor names of records, from the `ggml_src` attribute the llama.cpp recorder writes.

Alignment anchors nodes llama.cpp leaves unnamed by the weight they multiply, and tells the
four `norm-N` of a layer apart by what they normalise; both need each record's sources. They
live beside the tensor (docs/capture-format.md, "Recorder attributes"), not in the index, so
they are read only when a profile asks for them (`Profile.uses_sources`), and only through
`hdf5_safety.read_attribute`, which checks each attribute's type and size before reading it.
"""

from __future__ import annotations

import json

import h5py

from sessions.capture_reader import Capture, CaptureError
from sessions.hdf5_safety import UnsafeObject, read_attribute
from sessions.profiles import Profile

SRC_ATTR = "ggml_src"


def record_sources(capture: Capture) -> dict[int, tuple[str, ...]]:
    """seq -> source names, for every record that carries a well-formed `ggml_src`."""
    found: dict[int, tuple[str, ...]] = {}
    try:
        with h5py.File(capture.path, "r", locking=False) as file:
            for record in capture.records:
                try:
                    dataset_id = h5py.h5o.open(file.id, record.path.encode())
                    raw = read_attribute(dataset_id, record.path, SRC_ATTR)
                except (KeyError, ValueError, UnsafeObject):
                    continue
                if raw is None:
                    continue
                try:
                    names = json.loads(bytes(raw.item()).decode("utf-8"))
                except (ValueError, UnicodeDecodeError, TypeError, AttributeError):
                    continue
                if isinstance(names, list) and all(isinstance(n, str) for n in names):
                    found[record.seq] = tuple(names)
    except OSError as exc:
        raise CaptureError(capture.path, "file", f"cannot read source names ({exc})") from None
    return found


def sources_for(capture: Capture, profile: Profile) -> dict[int, tuple[str, ...]]:
    """The records' sources when `profile` matches on them; nothing otherwise (no reads)."""
    return record_sources(capture) if profile.uses_sources else {}
