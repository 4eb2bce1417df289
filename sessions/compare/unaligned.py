"""Why a record has no partner: the reasons alignment gives, in the words every surface uses.

A record without a pair is never dropped: it becomes an `UnalignedRecord` with its reason, from
mapping it to a canonical op (`sessions.compare.record_mapping`) or from pairing
(`sessions.compare.align`). The report, diagnose, rerun and the window say each reason in the
same words (`REASON_WORDS`); the JSON and the result cache keep its code.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessions.capture.reader import Record
from sessions.compare.key import OpKey

NO_RULE = "no_rule"
LAYER_CONFLICT = "layer_conflict"
LAYOUT = "layout"
NO_PARTNER = "no_partner"
DUPLICATE_KEY = "duplicate_key"
SHAPE_MISMATCH = "shape_mismatch"
DTYPE_MISMATCH = "dtype_mismatch"
ONE_SIDED = "one_sided"
"""A stage the profile knows the other engine has no tensor for (KV-cache views, kq, ...)."""
PADDED_DIFFERENTLY = "padded_differently"
"""A pair over caches padded to different lengths (attention scores or probabilities of runs cut differently):
the cells do not correspond one to one, and what the stage feeds is compared."""
CUT_DIFFERENTLY = "cut_differently"
"""Scores before the causal mask (`BEFORE_MASK`) of calls that had written different cells: a
call's scores over cells it had not written yet are whatever those cells held then, which differ
between runs cut into different calls and which the mask hides."""
NOT_RERUN = "not_rerun"
"""A record of a run compared with a rerun capture (role `rerun`) that the rerun did not recompute:
a rerun holds only the ops it was asked for."""
BY_DESIGN = frozenset({ONE_SIDED, PADDED_DIFFERENTLY, CUT_DIFFERENTLY, NOT_RERUN})
"""Unaligned reasons that are not findings: the runs hold these records differently by design."""
MANUAL_BREAK = "manual_break"
"""The user broke this pairing; the detail is their reason."""
OVERRIDE_MISSING = "override_missing"
"""A manual override names a record this capture does not hold (re-captured, or another run)."""
OVERRIDE_UNUSABLE = "override_unusable"
"""A manual pairing cannot be made: a record has no canonical op, or is already manually paired."""
NOT_BATCHED = "not_batched"
"""A record of a batched run whose stored axis 0 is not the batch: which row is the request is unknown."""
NO_POSITIONS = "no_positions"
"""Runs cut differently are compared position by position; this record cannot be cut by position."""
REASON_WORDS: dict[str, str] = {
    NO_RULE: "no profile rule names it",
    LAYER_CONFLICT: "layer conflict",
    LAYOUT: "layout does not apply",
    NO_PARTNER: "no partner",
    DUPLICATE_KEY: "key claimed twice",
    SHAPE_MISMATCH: "canonical shapes differ",
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
}
"""Each reason in the words every sentence uses (report, diagnose, rerun, the window); the JSON's
`reason` field and the result cache keep the code."""


@dataclass(frozen=True, slots=True)
class UnalignedRecord:
    """Slots, no dict each: a llama.cpp capture has tens of thousands of records no profile rule
    maps (building 80,000 into fresh memory alone: 0.11 s against 0.23 s)."""

    side: str
    seq: int
    name: str
    step: int
    segment: str
    layer: int
    occurrence: int
    reason: str
    detail: str
    key: OpKey | None = None

    def why(self) -> str:
        """Why the record has no partner, as every sentence says it: the reason in words, then its detail."""
        words = REASON_WORDS[self.reason]
        return f"{words}: {self.detail}" if self.detail else words


def unaligned_record(side: str, record: Record, reason: str, detail: str, key: OpKey | None = None) -> UnalignedRecord:
    return UnalignedRecord(
        side, record.seq, record.name, record.step, record.segment, record.layer, record.occurrence, reason, detail, key
    )
