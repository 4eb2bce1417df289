"""The words a person reads for the codes the comparison records: why a record has no partner
(sessions.compare.align) and what kind of contract finding an op has (sessions.compare.contracts).

The codes stay what the JSON, the cache and `report` carry; a surface written for people (the
window) shows these words in their place, so `no_partner` reads "no partner" wherever it is shown.
"""

from __future__ import annotations

from sessions.compare.align import (
    CUT_DIFFERENTLY,
    DTYPE_MISMATCH,
    DUPLICATE_KEY,
    LAYER_CONFLICT,
    LAYOUT,
    MANUAL_BREAK,
    NO_PARTNER,
    NO_POSITIONS,
    NO_RULE,
    NOT_BATCHED,
    NOT_RERUN,
    ONE_SIDED,
    OVERRIDE_MISSING,
    OVERRIDE_UNUSABLE,
    PADDED_DIFFERENTLY,
    SHAPE_MISMATCH,
)
from sessions.compare.contracts import (
    KERNEL_CONTRACT_MISMATCH,
    ROUTE_MISSING,
    ROUTE_UNVALIDATED,
)

CODE_WORDS: dict[str, str] = {
    NO_RULE: "no profile rule names it",
    LAYER_CONFLICT: "layer conflict",
    LAYOUT: "layout does not apply",
    NO_PARTNER: "no partner",
    DUPLICATE_KEY: "key claimed twice",
    SHAPE_MISMATCH: "shapes differ",
    DTYPE_MISMATCH: "dtypes differ",
    ONE_SIDED: "one-sided stage",
    PADDED_DIFFERENTLY: "caches padded differently",
    CUT_DIFFERENTLY: "runs cut differently",
    NOT_RERUN: "not rerun",
    MANUAL_BREAK: "broken by hand",
    OVERRIDE_MISSING: "manual override names no record here",
    OVERRIDE_UNUSABLE: "manual pairing cannot be made",
    NOT_BATCHED: "not stored by batch row",
    NO_POSITIONS: "no token positions",
    KERNEL_CONTRACT_MISMATCH: "kernel or contract differs",
    ROUTE_MISSING: "contract route incomplete",
    ROUTE_UNVALIDATED: "contract route not validated",
}
"""Every unaligned reason and contract finding kind, in words."""


def code_words(code: str) -> str:
    """A code in words; a code this table does not know yet (a newer capture's, a newer
    comparison's) with its underscores as spaces, still readable."""
    return CODE_WORDS.get(code, code.replace("_", " ").lower())
