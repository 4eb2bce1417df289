"""Source tensor names of records, from the `ggml_src` attribute the llama.cpp recorder writes.

Alignment anchors nodes llama.cpp leaves unnamed by the weight they multiply, and tells the
four `norm-N` of a layer apart by what they normalise; both need each record's sources. They
live beside the tensor (on its dataset, or in its pack's table `ggml_src[]`; docs/capture-format.md,
"Recorder attributes"), not in the index, so they are read only when a profile asks for them
(`Profile.uses_sources`), only for the records a rule that looks at sources could match by name
and kernel (each read of a record in a dataset of its own opens that dataset's object header:
about 85 us a record, 0.85 s for 10,000), and only through `hdf5_safety.read_attribute`, which
checks each attribute's type and size before reading it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import h5py

from sessions.capture.hdf5_safety import UnsafeObject
from sessions.capture.packed_attributes import PackedAttributes
from sessions.capture.reader import Capture, CaptureError, Record
from sessions.compare.profiles import NameRule, Profile

SRC_ATTR = "ggml_src"


def record_sources(capture: Capture, records: Iterable[Record] | None = None) -> dict[int, tuple[str, ...]]:
    """seq -> source names, for every record (of `records`; default all) that carries a
    well-formed `ggml_src`."""
    found: dict[int, tuple[str, ...]] = {}
    attribute = PackedAttributes(capture, SRC_ATTR)
    try:
        opened: tuple[str, h5py.h5o.ObjectID] | None = None
        for record in capture.records if records is None else records:
            try:
                if opened is None or opened[0] != record.path:
                    opened = (record.path, capture.open_object(record.path))
                raw = attribute.value(opened[1], record)
            except (KeyError, ValueError, UnsafeObject):
                continue
            if raw is None:
                continue
            try:
                names = json.loads(bytes(raw.item()).decode("utf-8"))
            except (ValueError, UnicodeDecodeError, TypeError, AttributeError, RecursionError):
                continue
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                found[record.seq] = tuple(names)
    except OSError as exc:
        raise CaptureError(capture.path, "file", f"cannot read source names ({exc})") from None
    return found


def _looks_at_sources(rule: NameRule, record: Record) -> bool:
    return (
        (rule.source is not None or rule.without_sources)
        and (rule.kernel is None or rule.kernel == record.kernel_id)
        and rule.regex.fullmatch(record.name) is not None
    )


def sources_for(capture: Capture, profile: Profile) -> dict[int, tuple[str, ...]]:
    """The sources of the records whose mapping under `profile` can depend on them (a rule with
    `source` or `without_sources` fits their name and kernel); nothing, with no reads, for a
    profile that never looks at sources."""
    if not profile.uses_sources:
        return {}
    rules = [r for r in profile.rules if r.source is not None or r.without_sources]
    return record_sources(capture, (r for r in capture.records if any(_looks_at_sources(rule, r) for rule in rules)))
