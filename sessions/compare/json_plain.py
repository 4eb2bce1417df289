"""Result objects as plain JSON values: one conversion for every document the tool writes.

The report document, its sidecar cache and the rerun document are all dataclass trees turned
into JSON; sharing the conversion keeps their conventions (non-finite floats as strings,
derived properties written beside the fields) identical.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cache
from typing import Any

import numpy as np

from sessions.compare.key import OpKey
from sessions.compare.pair_results import PairResults

DERIVED_PROPERTIES = ("bit_exact", "fraction_differing", "same", "passed", "exit_code", "headline", "label", "error_growth")
"""Properties written beside a dataclass's fields: readers of the document (pipelines, jq)
should not have to recompute them from the counts."""


def plain(value: Any, omit: frozenset[str] = frozenset()) -> Any:
    """`value` as dicts, lists, strings, numbers, booleans and None, for strict JSON.

    Dataclass fields and derived properties named in `omit` are left out at any depth. Arrays
    become None: a document names where bits are (capture, record), it does not carry them. An
    op key becomes its one text form (`0:visual:0:sdpa`), ready for `rerun --op`. Non-finite
    floats become the strings "NaN", "Infinity", "-Infinity" (strict JSON has no such numbers).
    """
    kind = type(value)
    if kind in PLAIN_TYPES:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _non_finite(value)
    shape = _shape_of(kind)
    if shape is not None:
        out = {}
        for group in shape:
            for name in group:
                if name not in omit:
                    field = getattr(value, name)
                    out[name] = field if type(field) in PLAIN_TYPES else plain(field, omit)  # most fields: no call
        return out
    if isinstance(value, np.ndarray):
        return None
    if isinstance(value, OpKey):
        return value.text()
    if isinstance(value, (list, tuple, PairResults)):
        return [v if type(v) in PLAIN_TYPES else plain(v, omit) for v in value]  # profiles: hundreds of ints, no call each
    if isinstance(value, dict):
        return {str(k): plain(v, omit) for k, v in value.items()}
    return value

PLAIN_TYPES = frozenset({int, str, bool, type(None)})
"""Types written as they are, checked first: they are most of a document's millions of values."""


def _non_finite(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def plain_names(tp: type) -> tuple[str, ...]:
    """The names `plain` writes for an instance of dataclass `tp`, in its order: its fields, then
    its derived properties (`DERIVED_PROPERTIES`). For writers that make a class's objects by the
    hundred thousand from their values, faster than `plain` but with its names."""
    shape = _shape_of(tp)
    if shape is None:
        raise TypeError(f"plain does not write {tp.__name__} field by field")
    return shape[0] + shape[1]


@cache
def _shape_of(tp: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """A dataclass's field names and the derived properties written beside them, looked up once
    per class (a real model's document has millions of objects); None for any other class."""
    if not dataclasses.is_dataclass(tp) or tp is OpKey:
        return None
    fields = tuple(f.name for f in dataclasses.fields(tp))
    return fields, tuple(name for name in DERIVED_PROPERTIES if isinstance(getattr(tp, name, None), property))
