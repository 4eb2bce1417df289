"""What a tolerance's bounds may be, checked alike wherever one is read: the command line, a
policy file, a gate manifest, a saved session.

A bound no comparison can use is refused where it is read, naming its place: a negative rtol
made a failing pair pass, and a ULP bound past 64 bits crashed the comparison.
"""

from __future__ import annotations

import math

MAX_ULP = 2**63 - 1
"""The largest ULP bound: distances are counted in 64 bits."""


def bound_problem(value: object) -> str | None:
    """Why `value` cannot be an atol or rtol (None when it can): a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return "must be a finite number >= 0"
    return None


def ulp_problem(value: object) -> str | None:
    """Why `value` cannot be a max_ulp (None when it can): a whole number from 0 to MAX_ULP."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ULP:
        return f"must be a whole number from 0 to {MAX_ULP}"
    return None


BOUNDS = ("atol", "rtol", "max_ulp")


def drop_zero_bounds(holder: object) -> None:
    """Set each of `holder`'s bounds that is 0 to None (a frozen dataclass's too, in its
    `__post_init__`). A bound of 0 is no bound wherever it is written (the command line, a
    session, a gate manifest, a policy file: TOML has no null): all at 0 is bit-exact, and one at 0
    never narrows another. A policy's `atol = 0` was a real bound, within which a -0/+0 swap
    passed, while `--atol 0` was bit-exact."""
    for bound in BOUNDS:
        if getattr(holder, bound) == 0:
            object.__setattr__(holder, bound, None)
