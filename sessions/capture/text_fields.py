"""Text from a capture that would be taken for something else: by a terminal, or by libhdf5.

A capture's text fields reach the terminal (`parity-xray report`, `validate`): an escape
sequence or a newline in a tensor name can clear the screen or forge a verdict line, so control
characters are refused, not only escaped where they are shown. A tensor path is also handed to
libhdf5, which reads an embedded NUL as its end (a path shown as one object opens another) and
which, like the link walker, has more than one spelling for one object; only the canonical
spelling is accepted, so that two rows name the same pack with the same bytes.

The checks work on the distinct values of a column (`sessions.capture.columns.codes`): an
index of a million rows has a few thousand distinct names.
"""

from __future__ import annotations

import re

import numpy as np

_SLASH, _DOT = ord("/"), ord(".")


def _bytes(values: np.ndarray, padding: int = 0) -> np.ndarray:
    """Fixed-length byte strings as a (values, bytes) uint8 matrix, with `padding` NUL columns added."""
    size = values.dtype.itemsize
    matrix = np.zeros((len(values), size + padding), dtype=np.uint8)
    matrix[:, :size] = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), size)
    return matrix


IGNORABLE_DRAWN_AS_NOTHING = (
    "\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2065\u3164\ufe00-\ufe0f\uffa0\ufff0-\ufff8\U000e0000-\U000e0fff"
)
"""Unicode's default-ignorable code points outside the categories Cc, Cf, Zl and Zp (the
combining grapheme joiner, Hangul fillers, variation selectors...): drawn as nothing, so "x"
and "x" followed by one print alike."""
BIDI_CONTROLS = "\u202a-\u202e\u2066-\u2069"
"""The bidirectional embeddings, overrides and isolates: shown, they reorder the text around
them, so a tensor name can read as another ("Trojan Source")."""
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
    + IGNORABLE_DRAWN_AS_NOTHING
    + "]"
)
"""Every character that is not drawn as itself: the controls (Unicode category Cc), the format
characters (Cf: zero-width spaces and joiners, directional marks, invisible operators, tags),
the line and paragraph separators (Zl, Zp) and the rest of Unicode's default-ignorable
characters. In a name, "x" and "x" followed by a zero-width space printed alike, and a line
separator broke a report's first line."""
_TEXT_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f" + BIDI_CONTROLS + "]|\r(?!\n)")
"""What a multi-line text (the prompt) may not hold: a prompt is someone's words, in any script,
with emoji sequences joined by zero-width joiners and directional marks in right-to-left text,
so only the controls a terminal acts on are refused. Line breaks (LF, CRLF) and tabs are text."""
EXCERPT_CHARACTERS = 60
"""How much of a long text a message shows around its control character: a prompt may be 60 MB."""


def control_character(text: str) -> str | None:
    """The first character of an identifier (a name, a segment, a kernel, a path, a short root
    attribute) that is not drawn as itself (`_CONTROL`), or None."""
    found = _CONTROL.search(text)
    return found.group() if found is not None else None


def text_control(text: str) -> tuple[str, str] | None:
    """(the first control character of a multi-line text, the text around it), or None; linear in
    the text's length (a per-line walk of a 60 MB prompt took 27 s)."""
    found = _TEXT_CONTROL.search(text)
    if found is None:
        return None
    start, end = found.start(), found.end()
    if len(text) <= EXCERPT_CHARACTERS:
        return found.group(), text
    before, after = max(0, start - EXCERPT_CHARACTERS // 2), min(len(text), end + EXCERPT_CHARACTERS // 2)
    return found.group(), f"{'…' if before else ''}{text[before:after]}{'…' if after < len(text) else ''}"


def identifier_problems(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For fixed-length text values (a column's distinct values): which are not UTF-8 (two byte
    strings would read as one text), and which hold a character `control_character` finds or a
    NUL before their last other byte (NUL padding after the text is how the format ends it)."""
    not_utf8, control = np.zeros(len(values), dtype=bool), np.zeros(len(values), dtype=bool)
    for at, raw in enumerate(values.tolist()):
        try:
            text = raw.rstrip(bytes(1)).decode("utf-8")
        except UnicodeDecodeError:
            not_utf8[at] = True
            continue
        control[at] = _CONTROL.search(text) is not None
    return not_utf8, control


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
