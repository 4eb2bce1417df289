"""Text from a capture that would be taken for something else: by a terminal, or by libhdf5.

A capture's text fields reach the terminal (`parity-xray report`, `validate`): an escape
sequence or a newline in a tensor name can clear the screen or forge a verdict line, so control
characters are refused, not only escaped where they are shown. A tensor path is also handed to
libhdf5, which reads an embedded NUL as its end (a path shown as one object opens another) and
which, like the link walker, has more than one spelling for one object; only the canonical
spelling is accepted, so that two rows name the same pack with the same bytes.

The checks work on the distinct values of a column (`sessions.capture.columns.codes`) as one
byte matrix: an index of a million rows has a few thousand distinct names.
"""

from __future__ import annotations

import numpy as np

_SLASH, _DOT = ord("/"), ord(".")
_C1_LEAD = 0xC2
"""UTF-8 encodes the C1 controls U+0080..U+009F as 0xC2 followed by 0x80..0x9F."""


def _bytes(values: np.ndarray, padding: int = 0) -> np.ndarray:
    """Fixed-length byte strings as a (values, bytes) uint8 matrix, with `padding` NUL columns added."""
    size = values.dtype.itemsize
    matrix = np.zeros((len(values), size + padding), dtype=np.uint8)
    matrix[:, :size] = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), size)
    return matrix


BIDI_CONTROLS = (range(0x202A, 0x202F), range(0x2066, 0x206A))
"""The bidirectional embeddings, overrides and isolates (U+202A..U+202E, U+2066..U+2069): shown,
they reorder the text around them, so a tensor name can read as another ("Trojan Source")."""
_BIDI_LEAD = 0xE2
"""UTF-8 encodes them as E2 80 AA..AE and E2 81 A6..A9."""


def has_control_characters(values: np.ndarray) -> np.ndarray:
    """Which fixed-length UTF-8 values hold a C0 or C1 control character, DEL, a bidirectional
    control (BIDI_CONTROLS), or a NUL before their last other byte (NUL padding after the text
    is how the format ends it)."""
    raw = _bytes(values, padding=2)
    text = np.cumsum(raw[:, ::-1] != 0, axis=1)[:, ::-1] > 0
    control = text & ((raw < 0x20) | (raw == 0x7F))
    control[:, :-1] |= (raw[:, :-1] == _C1_LEAD) & (raw[:, 1:] >= 0x80) & (raw[:, 1:] <= 0x9F)
    lead, second, third = raw[:, :-2] == _BIDI_LEAD, raw[:, 1:-1], raw[:, 2:]
    control[:, :-2] |= lead & (((second == 0x80) & (third >= 0xAA) & (third <= 0xAE)) | ((second == 0x81) & (third >= 0xA6) & (third <= 0xA9)))
    return control.any(axis=1)  # type: ignore[no-any-return]


def control_character(text: str) -> str | None:
    """The first control character of a decoded text (the one its message shows), or None:
    `has_control_characters` for one short text, such as a root attribute."""
    return next((c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or any(ord(c) in r for r in BIDI_CONTROLS)), None)


def is_non_canonical_path(values: np.ndarray) -> np.ndarray:
    """Which non-empty in-file paths are not written the one way: absolute, with no empty, `.` or
    `..` part (`//`, a trailing `/`, `/./`, `/../`); `/` alone is the root's one way. Ends of text
    (NUL padding) count as the end of a part."""
    raw = _bytes(values, padding=3)
    ends = (raw == 0) | (raw == _SLASH)
    slash, dot = raw[:, :-3] == _SLASH, raw == _DOT
    empty = slash & ends[:, 1:-2]
    one_dot = slash & dot[:, 1:-2] & ends[:, 2:-1]
    two_dots = slash & dot[:, 1:-2] & dot[:, 2:-1] & ends[:, 3:]
    written, root = raw[:, 0] != 0, (raw[:, 0] == _SLASH) & (raw[:, 1] == 0)
    return written & ~root & ((raw[:, 0] != _SLASH) | (empty | one_dot | two_dots).any(axis=1))  # type: ignore[no-any-return]
