"""What the format lets a stored attribute or table field be, and the values it can hold.

A capture comes from someone else's engine: an attribute stored as an array, a float or a
`uint64` past int64, or a table field of another type, is refused by place rather than read
as its first element, its default, or a wrapped number (sessions.capture.reader applies them).
"""

from __future__ import annotations

import numpy as np

from sessions.capture import format as cf


def text_problem(value: np.ndarray) -> str | None:
    """Why an attribute's value is not one string, or None. An array (even of one element, or of
    none) or a number is refused, not read: its first element or its digits would stand for the
    whole value, and an empty array for a missing one."""
    if value.shape != ():
        return f"is an array of shape {value.shape}; the format stores one string"
    if value.dtype.kind != "S":
        return f"is a scalar of type {value.dtype}; the format stores one string"
    return None


INT64_MAX = 2**63 - 1


def int_problem(value: np.ndarray) -> str | None:
    """Why an attribute's value is not one integer the format can hold, or None. A bool, a float or
    a one-element array is refused, not read: taking it for a default or a first element changes
    the verdict. A uint64 past int64 was read, then crashed the writer of a saved rerun."""
    if value.dtype.kind in "iu" and value.shape == ():
        if int(value) > INT64_MAX:
            return f"is {int(value)}, more than an int64 holds (the format stores H5T_STD_I64LE)"
        return None
    shape = "a scalar" if value.shape == () else f"an array of shape {value.shape}"
    return f"is {shape} of type {value.dtype}; the format stores one integer (a scalar, e.g. H5T_STD_I64LE)"


def field_problem(stored: np.dtype, expected: np.dtype) -> str | None:
    """Why a stored compound cannot stand for the format's table, or None when every field fits."""
    missing = [n for n in expected.names if n not in stored.names and n not in cf.INDEX_OPTIONAL_FIELDS]
    if missing:
        return f"lacks field(s) {', '.join(missing)}"
    for name in (n for n in expected.names if n in stored.names):
        have, want = stored[name], expected[name]
        if have.shape != want.shape:
            return f"field {name!r} has shape {have.shape}; the format's is {want.shape}"
        have_kind, want_kind = have.base.kind, want.base.kind
        if want_kind == "S":
            if have_kind != "S" or have.base.itemsize > want.base.itemsize:
                return f"field {name!r} is {have.base}; the format's is a fixed-length string of {want.base.itemsize} bytes"
        elif have_kind not in "iu" or have.base.itemsize > want.base.itemsize:
            return f"field {name!r} is {have.base}; the format's is {want.base}"
    return None


def past_signed(values: np.ndarray, signed: np.dtype) -> int | None:
    """The first row of an unsigned column of the width of the format's signed field holding a
    value past its largest, or None: cast, 4294967295 read as step -1 ("step is negative")."""
    signed = signed.base  # a sub-array field (the index's shape) by its elements' type
    if values.dtype.kind != "u" or signed.kind != "i" or values.dtype.itemsize < signed.itemsize or not len(values):
        return None
    past = (values > np.iinfo(signed).max).reshape(len(values), -1).any(axis=1)
    return int(np.argmax(past)) if past.any() else None
