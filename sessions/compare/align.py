"""Pairing native and oracle records by (step, segment, layer, canonical op, occurrence).

Alignment never guesses: a key held by two records of one side is an error for both (and
for their would-be partner), and every record that ends up without a pair is listed with
its reason. Only index metadata is used here -- no tensor bytes are read. The user has the
last word through overrides (ManualPair, ManualBreak), which name records by RecordKey rather
than seq so a saved session still means the same records after a re-capture.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import accumulate, compress, repeat
from operator import and_, attrgetter, eq, itemgetter
from typing import NamedTuple

import numpy as np

from sessions.bits.dtypes import logical_dtype
from sessions.capture.columns import Coded, shared_codes
from sessions.capture.reader import Record
from sessions.capture.records import Records
from sessions.compare.align_modes import CALLS, POSITIONS
from sessions.compare.aligned_pairs import AlignedPair, AlignedPairs
from sessions.compare.key import OpKey, RecordKey
from sessions.compare.mapped_record import (
    BatchRow,
    MappedRecord,
    cut_problem,
)
from sessions.compare.positions import (
    Call,
    RecordSpans,
    Span,
    overlap,
    span_text,
    uncovered,
)
from sessions.compare.profiles import (
    Profile,
    canonical_axes,
    padded_axis,
    rows_axis,
)
from sessions.compare.record_columns import KeyColumns, shared_keys
from sessions.compare.record_mapping import MappedKinds, MappedRun, map_records
from sessions.compare.unaligned import (
    BY_DESIGN,
    CUT_DIFFERENTLY,
    DTYPE_MISMATCH,
    DUPLICATE_KEY,
    MANUAL_BREAK,
    NO_PARTNER,
    NO_POSITIONS,
    ONE_SIDED,
    OVERRIDE_MISSING,
    OVERRIDE_UNUSABLE,
    PADDED_DIFFERENTLY,
    SHAPE_MISMATCH,
    UnalignedRecord,
    unaligned_record,
)
from sessions.printable import printable

BEFORE_MASK = frozenset({"attn_scores"})
"""Ops that hold every cache cell before the causal mask."""


@dataclass(frozen=True)
class ManualPair:
    """Pair these two records whatever the profiles say; both leave automatic matching.

    Records are named by RecordKey (step, segment, layer, name, occurrence), not seq, so the
    override still means the same records after a re-capture."""

    native: RecordKey
    oracle: RecordKey
    reason: str


@dataclass(frozen=True)
class ManualBreak:
    """Unpair the native record from whatever it is paired with; both sides become unaligned."""

    native: RecordKey
    reason: str


AlignOverride = ManualPair | ManualBreak


@dataclass
class Alignment:
    pairs: Sequence[AlignedPair]
    """In the native engine's execution order (record sequence)."""
    unaligned: list[UnalignedRecord]
    native_profile: str
    oracle_profile: str
    mode: str = CALLS
    native_calls: list[Call] = field(default_factory=list)
    oracle_calls: list[Call] = field(default_factory=list)


def _recorded(mapped: list[MappedRecord]) -> set[tuple[int, str]]:
    """The (layer, op) a side has records of."""
    return {(m.key.layer, m.key.op) for m in mapped}


class _Candidates(NamedTuple):
    """A side's mapped records still to pair automatically, in execution order, with their keys as
    columns row for row (`_pair_by_key` pairs by those)."""

    mapped: list[MappedRecord]
    keys: KeyColumns

    def only(self, keep: list[bool]) -> _Candidates:
        """The rows `keep` marks, keys and records alike: manual pairs and one-sided records leave automatic matching."""
        if all(keep):
            return self
        return _Candidates(list(compress(self.mapped, keep)), self.keys.rows(np.flatnonzero(keep)))


def _unless_recorded(side: str, candidates: _Candidates, optional: dict[int, str], other: set[tuple[int, str]], unaligned: list[UnalignedRecord]) -> _Candidates:
    """A side's records without those of optional stages (the KV cache's written cells) whose op
    the other capture never records in that layer: one-sided with their reason, not a partner
    missing per record. By layer, because an engine may record a stage in some layers only
    (mlx-lm's sliding-window layers keep a rotating cache, which `record mlx` does not record)."""
    if not optional:
        return candidates
    keep = [m.record.seq not in optional or (m.key.layer, m.key.op) in other for m in candidates.mapped]
    for m, kept in zip(candidates.mapped, keep):
        if not kept:
            unaligned.append(unaligned_record(side, m.record, ONE_SIDED, optional[m.record.seq], m.key))
    return candidates.only(keep)


def _latest(overrides: tuple[AlignOverride, ...]) -> tuple[AlignOverride, ...]:
    """The user's last word on each native record: pairing a record whose pair was broken (or
    breaking a manual pair) replaces the earlier override rather than fighting it."""
    last = {o.native: o for o in overrides}
    return tuple(o for o in overrides if last[o.native] is o)


def _override_problem(side: str, key: RecordKey, reason: str, detail: str) -> UnalignedRecord:
    """A row for an override that could not be applied, named by the record it names (seq -1:
    the row stands for the override, not for a record, which may not exist)."""
    return UnalignedRecord(side, -1, printable(key.name), key.step, printable(key.segment), key.layer, key.occurrence, reason, detail)


def _take_manual_pairs(
    overrides: tuple[AlignOverride, ...],
    n_candidates: _Candidates,
    o_candidates: _Candidates,
    native: Sequence[Record],
    oracle: Sequence[Record],
    unaligned: list[UnalignedRecord],
) -> tuple[list[AlignedPair], _Candidates, _Candidates]:
    """The manual pairs, and each side's candidates without their records (automatic matching
    never sees them); every override that cannot be applied adds a row saying why."""
    if not any(isinstance(override, ManualPair) for override in overrides):
        return [], n_candidates, o_candidates  # a real run's 240,000 records: their keys cost 1 s to index for nothing
    sides = {"native": n_candidates, "oracle": o_candidates}
    record_keys = {side: [RecordKey.of(m.record) for m in candidates.mapped] for side, candidates in sides.items()}
    mapped = {side: dict(zip(record_keys[side], candidates.mapped)) for side, candidates in sides.items()}
    present = {"native": {RecordKey.of(r) for r in native}, "oracle": {RecordKey.of(r) for r in oracle}}
    taken: set[tuple[str, RecordKey]] = set()
    pairs: list[AlignedPair] = []
    for override in overrides:
        if not isinstance(override, ManualPair):
            continue
        what = f"manual pairing of native {override.native.name!r} with oracle {override.oracle.name!r} ({override.reason})"
        problems = []
        for side, key in (("native", override.native), ("oracle", override.oracle)):
            if key not in present[side]:
                problems.append(_override_problem(side, key, OVERRIDE_MISSING, f"{what}: no such {side} record"))
            elif key not in mapped[side]:
                problems.append(_override_problem(side, key, OVERRIDE_UNUSABLE, f"{what}: the record has no canonical op under its profile"))
            elif (side, key) in taken:
                problems.append(_override_problem(side, key, OVERRIDE_UNUSABLE, f"{what}: the record is already manually paired"))
        if problems:
            unaligned.extend(problems)
            continue
        n, o = mapped["native"][override.native], mapped["oracle"][override.oracle]
        taken.update({("native", override.native), ("oracle", override.oracle)})
        pairs.append(AlignedPair(n.key, n, o, override.reason))
    return (
        pairs,
        n_candidates.only([("native", key) not in taken for key in record_keys["native"]]),
        o_candidates.only([("oracle", key) not in taken for key in record_keys["oracle"]]),
    )


def _apply_breaks(
    overrides: tuple[AlignOverride, ...], pairs: list[AlignedPair], native: Sequence[Record], unaligned: list[UnalignedRecord]
) -> list[AlignedPair]:
    """Pairs left after the user's breaks; both records of a broken pair become unaligned."""
    breaks = {o.native: o.reason for o in overrides if isinstance(o, ManualBreak)}
    if not breaks:
        return pairs
    present = {RecordKey.of(r) for r in native}
    for key, reason in breaks.items():
        if key not in present:
            unaligned.append(_override_problem("native", key, OVERRIDE_MISSING, f"manual break ({reason}): no such native record"))
    kept: list[AlignedPair] = []
    for pair in pairs:
        reason = breaks.get(RecordKey.of(pair.native.record))
        if reason is None:
            kept.append(pair)
            continue
        unaligned.append(unaligned_record("native", pair.native.record, MANUAL_BREAK, reason, pair.key))
        unaligned.append(unaligned_record("oracle", pair.oracle.record, MANUAL_BREAK, reason, pair.oracle.key))
    return kept


def _comparable(pair: AlignedPair, unaligned: list[UnalignedRecord]) -> bool:
    """Whether both sides hold the same canonical shape and dtype; if not, both become unaligned."""
    n, o = pair.native, pair.oracle
    problem = None
    padded = padded_axis(pair.key.op)
    if n.shape != o.shape and padded is not None and _differ_only_on(n.shape, o.shape, padded):
        problem = (
            PADDED_DIFFERENTLY,
            f"the caches were padded to {n.shape[padded]} and {o.shape[padded]} cells, so the cells do not correspond one to one; what {pair.key.op} feeds is compared",
        )
    elif n.shape != o.shape:
        problem = (SHAPE_MISMATCH, f"native {list(n.shape)} vs oracle {list(o.shape)}")
    elif n.record.dtype != o.record.dtype:
        problem = (DTYPE_MISMATCH, f"native {n.record.dtype} vs oracle {o.record.dtype}")
    if problem is None:
        return True
    detail = problem[1] if pair.manual_reason is None else f"{problem[1]} (manual pairing: {pair.manual_reason})"
    unaligned.append(unaligned_record("native", n.record, problem[0], detail, pair.key))
    unaligned.append(unaligned_record("oracle", o.record, problem[0], detail, o.key))
    return False


def _logits_of_other_rows(pair: AlignedPair, spans: CallSpans) -> bool:
    """Whether a pair is the logits of a call's every row against the logits of its last rows
    only, in a call both runs made alike (`made_alike`, `_last_logits_rows`)."""
    if pair.key.op != "logits":
        return False
    n, o = pair.native, pair.oracle
    axis = rows_axis(pair.key.op)
    return (
        pair.manual_reason is None and n.shape != o.shape and _differ_only_on(n.shape, o.shape, axis)
        and min(n.shape[axis], o.shape[axis]) > 0 and made_alike(pair, spans)
    )


CallSpans = tuple[dict[tuple[int, str], Span], dict[tuple[int, str], Span]]
"""Each run's calls' positions by (step, segment), native then oracle (`call_spans`)."""


def call_spans(native_calls: list[Call], oracle_calls: list[Call]) -> CallSpans:
    return {(c.step, c.segment): c.span for c in native_calls}, {(c.step, c.segment): c.span for c in oracle_calls}


def made_alike(pair: AlignedPair, spans: CallSpans) -> bool:
    """Whether a pair is of two whole records, each in its run's call over the same positions as
    the other's (a decode step's, whatever the prompt's cut)."""
    n, o = pair.native, pair.oracle
    if n.window is not None or o.window is not None:
        return False
    span = spans[0].get((n.record.step, n.record.segment))
    return span is not None and span == spans[1].get((o.record.step, o.record.segment))


def _last_logits_rows(pair: AlignedPair, spans: CallSpans) -> AlignedPair:
    """The logits of a call's every row against the logits of its last rows only (llama.cpp by
    default and vLLM compute only the rows they sample from): the last rows both computed are
    compared. Compared whole, their shapes differed, and identical runs read as DIVERGENCE. Only
    in a call both made alike: the last rows of calls cut differently are other positions."""
    if not _logits_of_other_rows(pair, spans):
        return pair
    axis = rows_axis(pair.key.op)
    both = min(pair.native.shape[axis], pair.oracle.shape[axis])
    native, oracle = (m.cut((m.shape[axis] - both, m.shape[axis]), pair.key) for m in (pair.native, pair.oracle))
    return pair._replace(native=native, oracle=oracle)


def _alike(pairs: list[AlignedPair]) -> list[bool]:
    """Whether each pair's sides hold the same canonical shape and dtype (so `_comparable`), found
    by `map` in C: a call of `_comparable` per pair took 0.08 s of a real run's alignment."""
    shapes = (map(itemgetter(3), map(itemgetter(side), pairs)) for side in (1, 2))
    dtypes = (map(attrgetter("record.dtype"), map(itemgetter(side), pairs)) for side in (1, 2))
    return list(map(and_, map(eq, *shapes), map(eq, *dtypes)))


def _set_aside_before_mask(
    pairs: list[AlignedPair], native_spans: RecordSpans, oracle_spans: RecordSpans, unaligned: list[UnalignedRecord]
) -> list[AlignedPair]:
    """Pairs without those of `BEFORE_MASK` ops whose records' calls end at different positions
    (so had written different cells) unless the user paired them; those become `cut_differently`
    on both sides."""
    before_mask = list(map(BEFORE_MASK.__contains__, map(itemgetter(3), map(itemgetter(0), pairs))))
    if not any(before_mask):
        return pairs  # a statement per pair took 0.05 s of a 240,000-record pair's alignment
    n_spans, o_spans = native_spans.by_seq(), oracle_spans.by_seq()
    kept: list[AlignedPair] = []
    for pair, scores in zip(pairs, before_mask):
        if not scores or pair.manual_reason is not None:
            kept.append(pair)
            continue
        n_span, o_span = n_spans.get(pair.native.record.seq), o_spans.get(pair.oracle.record.seq)
        if n_span is None or o_span is None or n_span[1] == o_span[1]:  # no span: a record of another rank, whose shape says what differs
            kept.append(pair)
            continue
        detail = (
            f"{pair.key.op} before the causal mask, from calls that had written the cache up to position {n_span[1]} (native) "
            f"and {o_span[1]} (oracle): the cells one had written and the other had not hold other bits, which the mask hides"
        )
        unaligned.append(unaligned_record("native", pair.native.record, CUT_DIFFERENTLY, detail, pair.key))
        unaligned.append(unaligned_record("oracle", pair.oracle.record, CUT_DIFFERENTLY, detail, pair.oracle.key))
    return kept


def _differ_only_on(a: tuple[int, ...], b: tuple[int, ...], axis: int) -> bool:
    return len(a) == len(b) and all(x == y for i, (x, y) in enumerate(zip(a, b)) if i != axis)


def _manually_paired(side: str, manual: list[AlignedPair], holds: Callable[[MappedRecord], bool]) -> str | None:
    """Why a record has no partner when the one it would have had is `side`'s record of a manual
    pair (`holds` picks it): a manual pairing takes its records out of automatic matching, and
    "no oracle record for ..." was false of a record the user had paired elsewhere."""
    for pair in manual:
        mine, other = (pair.oracle, pair.native) if side == "oracle" else (pair.native, pair.oracle)
        if holds(mine):
            other_side = "native" if side == "oracle" else "oracle"
            return (
                f"the {side} record that would pair with it, {mine.record.name!r} (seq {mine.record.seq}), is manually paired "
                f"with {other_side} {other.record.name!r} (seq {other.record.seq}) ({pair.manual_reason})"
            )
    return None


class _SetAside:
    """The records each side set aside before pairing (its profile refused them, two claimed one
    key or one position, they cannot be cut), by op: a record whose partner is one of them says
    so. "No oracle record of layer_out holds positions 3-6" was the headline of a pair whose two
    oracle records both claimed positions 3-6, above the lines listing them. Found by key, or by
    a bisection of each op's spans: a run whose every record of one side is set aside asks once
    per record of the other (a scan per lookup made a 216,000-record alignment take 13 s)."""

    def __init__(
        self, unaligned: list[UnalignedRecord], spans: dict[str, dict[int, Span]] | None = None, calls: dict[str, list[Call]] | None = None
    ) -> None:
        self._by_key: dict[tuple[str, OpKey], UnalignedRecord] = {}
        spanned: dict[tuple[str, int, str, int], list[tuple[int, int, UnalignedRecord]]] = defaultdict(list)
        call_spans = {side: {(c.step, c.segment): c.span for c in side_calls} for side, side_calls in (calls or {}).items()}
        for u in unaligned:
            if u.key is None or u.reason in BY_DESIGN:
                continue
            self._by_key.setdefault((u.side, u.key), u)
            if spans is None:
                continue
            # A record with no span of its own stands for the positions its call holds, when its
            # call's other records say which: matched by step alone, it was named the partner of
            # positions another call of that step held.
            span = spans[u.side].get(u.seq) or call_spans.get(u.side, {}).get((u.step, u.segment))
            if span is not None:
                spanned[(u.side, u.key.layer, u.key.op, u.key.occurrence)].append((span[0], span[1], u))
        self._spanned: dict[tuple[str, int, str, int], tuple[list[int], list[int], list[int], list[UnalignedRecord]]] = {}
        """Per op, in order of first position: the spans' firsts, their stops, the furthest stop of
        any span up to each one, and the records."""
        for op, rows in spanned.items():
            rows.sort(key=itemgetter(0))
            stops = [stop for _, stop, _ in rows]
            self._spanned[op] = ([first for first, _, _ in rows], stops, list(accumulate(stops, max)), [u for _, _, u in rows])

    def partner(self, side: str, key: OpKey, gap: Span | None = None) -> UnalignedRecord | None:
        """`side`'s set-aside record that would have paired with the other side's record of `key`
        (runs paired by position: one that holds some of `gap`, or whose call does)."""
        if gap is None:
            return self._by_key.get((side, key))
        spanned = self._spanned.get((side, key.layer, key.op, key.occurrence))
        if spanned is None:
            return None
        firsts, stops, reach, rows = spanned
        at = bisect_left(firsts, gap[1]) - 1  # the last span starting before the gap ends
        found: UnalignedRecord | None = None
        while at >= 0 and reach[at] > gap[0]:  # no span before one whose reach ends by the gap's start overlaps it
            if stops[at] > gap[0]:
                found = rows[at]  # the earliest overlapping one is named: the first that claimed the positions
            at -= 1
        return found

    def unaligned(self, side: str, record: Record, key: OpKey, gap: Span | None = None) -> UnalignedRecord | None:
        """`record`'s row when its partner on the other side was set aside; None when it was not."""
        other = "oracle" if side == "native" else "native"
        found = self.partner(other, key, gap)
        if found is None:
            return None
        partner = f"its {other} partner {found.name!r} (seq {found.seq})"
        if found.reason == DUPLICATE_KEY:
            return unaligned_record(side, record, DUPLICATE_KEY, f"{partner} is ambiguous: {found.detail}", key)
        return unaligned_record(side, record, NO_PARTNER, f"{partner} is unaligned itself: {found.why()}", key)


def _pair_by_key(n: _Candidates, o: _Candidates, unaligned: list[UnalignedRecord], manual: list[AlignedPair]) -> list[AlignedPair]:
    """Same calls: records pair when their keys are equal; a key claimed twice pairs nothing.
    Keys are compared as integers (`shared_keys`), counted per side."""
    set_aside = _SetAside(unaligned)
    n_key, o_key, distinct = shared_keys(n.keys, o.keys)
    counts = {"native": np.bincount(n_key, minlength=distinct), "oracle": np.bincount(o_key, minlength=distinct)}
    for side, other, candidates, key_of in (("native", "oracle", n, n_key), ("oracle", "native", o, o_key)):
        mine, theirs = counts[side][key_of], counts[other][key_of]
        claimed: dict[int, list[MappedRecord]] = defaultdict(list)
        for row in np.flatnonzero(mine > 1).tolist():
            claimed[int(key_of[row])].append(candidates.mapped[row])
        for group in claimed.values():
            names = ", ".join(f"{m.record.name!r} (seq {m.record.seq})" for m in group)
            for m in group:
                unaligned.append(unaligned_record(side, m.record, DUPLICATE_KEY, f"{m.key.label()} is claimed by {names}", m.key))
        for row in np.flatnonzero((mine == 1) & (theirs > 1)).tolist():
            m = candidates.mapped[row]
            unaligned.append(unaligned_record(side, m.record, DUPLICATE_KEY, f"its partner key {m.key.label()} is ambiguous on the {other} side", m.key))
        for row in np.flatnonzero((mine == 1) & (theirs == 0)).tolist():
            m = candidates.mapped[row]
            unaligned.append(_without_partner(side, m, manual, set_aside, f"no {other} record for {m.key.label()}"))
    paired = (counts["native"][n_key] == 1) & (counts["oracle"][n_key] == 1)
    single = counts["oracle"][o_key] == 1
    oracle_row = np.full(distinct, -1, dtype=np.int64)
    oracle_row[o_key[single]] = np.flatnonzero(single)
    natives = list(compress(n.mapped, paired.tolist()))
    oracles = list(map(o.mapped.__getitem__, oracle_row[n_key[paired]].tolist()))
    # One `map` in C: a statement per pair took 0.1 s of a 240,000-record pair's alignment.
    return list(map(partial(tuple.__new__, AlignedPair), zip(map(itemgetter(1), natives), natives, oracles, repeat(None))))


def _pair_by_key_columns(n: MappedRun, o: MappedRun, unaligned: list[UnalignedRecord]) -> AlignedPairs | None:
    """`_pair_by_key` of runs without overrides or optional records, on columns: the pairs as
    `AlignedPairs`, sorted by native seq, with `_comparable` and the set-aside before the mask
    applied. None where a pair needs what only the records say (a before-the-mask op, logits of
    other rows): the caller pairs the records then."""
    assert n.kinds is not None and o.kinds is not None
    set_aside = _SetAside(unaligned)
    n_key, o_key, distinct = shared_keys(n.keys, o.keys)
    counts = {"native": np.bincount(n_key, minlength=distinct), "oracle": np.bincount(o_key, minlength=distinct)}
    for side, other, run, key_of in (("native", "oracle", n, n_key), ("oracle", "native", o, o_key)):
        assert run.kinds is not None
        mine, theirs = counts[side][key_of], counts[other][key_of]
        claimed: dict[int, list[MappedRecord]] = defaultdict(list)
        for row in np.flatnonzero(mine > 1).tolist():
            claimed[int(key_of[row])].append(run.kinds.one(row))
        for group in claimed.values():
            names = ", ".join(f"{m.record.name!r} (seq {m.record.seq})" for m in group)
            for m in group:
                unaligned.append(unaligned_record(side, m.record, DUPLICATE_KEY, f"{m.key.label()} is claimed by {names}", m.key))
        for row in np.flatnonzero((mine == 1) & (theirs > 1)).tolist():
            m = run.kinds.one(row)
            unaligned.append(unaligned_record(side, m.record, DUPLICATE_KEY, f"its partner key {m.key.label()} is ambiguous on the {other} side", m.key))
        for row in np.flatnonzero((mine == 1) & (theirs == 0)).tolist():
            m = run.kinds.one(row)
            unaligned.append(_without_partner(side, m, [], set_aside, f"no {other} record for {m.key.label()}"))
    paired = (counts["native"][n_key] == 1) & (counts["oracle"][n_key] == 1)
    single = counts["oracle"][o_key] == 1
    oracle_row = np.full(distinct, -1, dtype=np.int64)
    oracle_row[o_key[single]] = np.flatnonzero(single)
    n_at = np.flatnonzero(paired)
    o_at = oracle_row[n_key[n_at]]
    pairs = AlignedPairs(n.kinds, o.kinds, n_at, o_at, n.keys.rows(n_at))
    if len(pairs.op_rows(BEFORE_MASK)):
        return None
    # `_comparable`: canonical shapes (by kind) and dtypes (by index row) alike on both sides.
    n_shapes = Coded([m.shape for m in n.kinds.mappings], n.kinds.kind_of)
    o_shapes = Coded([m.shape for m in o.kinds.mappings], o.kinds.kind_of)
    canonical = shared_codes(n_shapes, o_shapes)
    n_rows, o_rows = pairs.index_rows()
    dtypes = shared_codes(n.kinds.records.columns.texts("dtype"), o.kinds.records.columns.texts("dtype"))
    alike = (canonical[0][n_at] == canonical[1][o_at]) & (dtypes[0][n_rows] == dtypes[1][o_rows])
    if not alike.all():
        spans = call_spans(n.calls, o.calls)
        if any(_logits_of_other_rows(pairs[at], spans) for at in np.flatnonzero(~alike).tolist()):
            return None  # such a pair is cut (`_last_logits_rows`), which only a pair of records holds
        keep = alike.copy()
        for at in np.flatnonzero(~alike).tolist():
            keep[at] = _comparable(pairs[at], unaligned)
        pairs = AlignedPairs(n.kinds, o.kinds, n_at[keep], o_at[keep], n.keys.rows(n_at[keep]))
    seqs = pairs.seqs[0]
    if len(seqs) > 1 and not (seqs[1:] > seqs[:-1]).all():
        order = np.argsort(seqs, kind="stable")
        pairs = AlignedPairs(n.kinds, o.kinds, pairs.n_at[order], pairs.o_at[order], pairs.keys_columns.rows(order))
    return pairs


def _without_partner(side: str, m: MappedRecord, manual: list[AlignedPair], set_aside: _SetAside, otherwise: str) -> UnalignedRecord:
    """Runs paired by calls: why `m` has no partner, the most specific reason first (the user paired it elsewhere, its partner was set aside)."""
    other = "oracle" if side == "native" else "native"
    taken = _manually_paired(other, manual, lambda partner: partner.key == m.key)
    if taken is not None:
        return unaligned_record(side, m.record, NO_PARTNER, taken, m.key)
    return set_aside.unaligned(side, m.record, m.key) or unaligned_record(side, m.record, NO_PARTNER, otherwise, m.key)


Placed = tuple[Span, MappedRecord]
OpGroup = tuple[int, str, int]
"""(layer, op, occurrence): the records of one op, which runs cut differently pair by position."""


def _placed(
    side: str, mapped: list[MappedRecord], spans: dict[int, Span], unaligned: list[UnalignedRecord], uncuttable: dict[int, str]
) -> dict[OpGroup, list[Placed]]:
    """A side's records by (layer, op, occurrence), sorted by position; records whose positions
    are unknown, that hold none (no rows) in a call that holds some, or that claim positions
    another record of the same op holds, are unaligned; a call of no rows at all is left out.
    Records that cannot be cut are placed too, with why in `uncuttable` (by seq): one whose
    partner holds the same positions needs no cut (`_cut_only_where_needed`)."""
    groups: dict[OpGroup, list[Placed]] = defaultdict(list)
    held_calls = {(m.key.step, m.key.segment) for m in mapped if (span := spans.get(m.record.seq)) is not None and span[1] > span[0]}
    for m in mapped:
        span = spans.get(m.record.seq)
        if span is None:
            axes = canonical_axes(m.key.op)
            problem = (
                f"its canonical shape {list(m.shape)} has {len(m.shape)} axes where {m.key.op} has {len(axes)} ({' '.join(axes)}), so which "
                "holds the token positions is unknown (a batched run whose capture does not say so with batch_size?)"
            )
            unaligned.append(unaligned_record(side, m.record, NO_POSITIONS, problem, m.key))
            continue
        if span[1] <= span[0]:
            if (m.key.step, m.key.segment) in held_calls:
                unaligned.append(unaligned_record(side, m.record, NO_POSITIONS, f"its canonical shape {list(m.shape)} has no rows, so it holds no token position", m.key))
            continue  # a call of no rows at all computed nothing: an empty segment of identical runs read as DIVERGENCE
        cut = "quantized blocks cannot be cut into positions" if logical_dtype(m.record.dtype).is_quantized else cut_problem(m)
        if cut is not None:
            uncuttable[m.record.seq] = cut
        groups[m.key[2:5]].append((span, m))  # (layer, op, occurrence)
    for group in groups.values():
        group.sort(key=itemgetter(0))
        clashing = _clashes([span for span, _ in group])
        if not clashing:
            continue
        for i in sorted(clashing):
            shared, m = clashing[i], group[i][1]
            unaligned.append(unaligned_record(side, m.record, DUPLICATE_KEY, f"{span_text(shared)} of {m.key.op} {'is' if shared[1] - shared[0] == 1 else 'are'} held by more than one {side} record", m.key))
        group[:] = [placed for i, placed in enumerate(group) if i not in clashing]
    return groups


def _clashes(spans: list[Span]) -> dict[int, Span]:
    """Of spans sorted by first position, each that shares positions with another, and positions
    it shares with one of them. A span overlaps an earlier one exactly when it starts before the
    furthest stop so far, and a later one exactly when it stops after the next one starts:
    looked for between neighbours alone, a record inside a longer one past its neighbour was
    paired while its twin was refused."""
    found: dict[int, Span] = {}
    widest: int | None = None
    for i, span in enumerate(spans):
        if widest is not None and span[0] < spans[widest][1]:
            found[i] = (span[0], min(span[1], spans[widest][1]))
        elif i + 1 < len(spans) and span[1] > spans[i + 1][0]:
            found[i] = (spans[i + 1][0], min(span[1], spans[i + 1][1]))
        if widest is None or span[1] > spans[widest][1]:
            widest = i
    return found


def _cut_only_where_needed(
    placed: dict[str, dict[OpGroup, list[Placed]]], uncuttable: dict[str, dict[int, str]], unaligned: list[UnalignedRecord]
) -> None:
    """Records that cannot be cut (quantized blocks, a layout merging the rows with another axis)
    stay placed where the other side holds a record of exactly their positions, which pairs
    whole, as every decode step's does; the others are unaligned (`no_positions`). Refused
    wherever they stood, a q8_0 cache compared across micro-batch sizes could never reach PARITY."""
    if not uncuttable["native"] and not uncuttable["oracle"]:
        return
    held = {side: {group: {span for span, _ in group_placed} for group, group_placed in groups.items()} for side, groups in placed.items()}
    for side, groups in placed.items():
        other = held["oracle" if side == "native" else "native"]
        for group, group_placed in groups.items():
            kept: list[Placed] = []
            for span, m in group_placed:
                why = uncuttable[side].get(m.record.seq)
                if why is not None and span not in other.get(group, set()):
                    unaligned.append(unaligned_record(side, m.record, NO_POSITIONS, why, m.key))
                else:
                    kept.append((span, m))
            group_placed[:] = kept


def _pair_by_position(
    n_mapped: list[MappedRecord],
    o_mapped: list[MappedRecord],
    spans: dict[str, dict[int, Span]],
    calls: dict[str, list[Call]],
    unaligned: list[UnalignedRecord],
    manual: list[AlignedPair],
) -> list[AlignedPair]:
    """Runs cut differently: each (layer, op, occurrence) pairs the positions both sides hold, one
    pair per overlap of a native and an oracle record, named by the native call and the positions.
    `spans` and `calls` are each side's (`record_spans`), by side."""
    uncuttable: dict[str, dict[int, str]] = {"native": {}, "oracle": {}}
    natives = _placed("native", n_mapped, spans["native"], unaligned, uncuttable["native"])
    oracles = _placed("oracle", o_mapped, spans["oracle"], unaligned, uncuttable["oracle"])
    _cut_only_where_needed({"native": natives, "oracle": oracles}, uncuttable, unaligned)
    pairs, short = _overlaps(natives, oracles)
    set_aside = _SetAside(unaligned, spans, calls)
    for side, other, theirs in (("native", "oracle", oracles), ("oracle", "native", natives)):
        covered: dict[OpGroup, list[Span]] = {}
        their_spans = sorted({call.span for call in calls[other]})
        their_ends = sorted({stop for _, stop in their_spans})
        for group, span, m in short[side]:
            if group not in covered:
                covered[group] = [their_span for their_span, _ in theirs.get(group, [])]
            for gap in uncovered(span, covered[group]):
                if m.key.op == "logits" and covered[group] and _inside_a_call(gap, their_spans) and not _ends_a_call(gap, their_ends):
                    # Logits of rows the other run computed in a call that does not end on them, so
                    # did not compute logits for (llama.cpp by default and vLLM compute only the rows
                    # they sample from): nothing to compare, no finding. Judged by this run's own
                    # calls, a prompt it split into chunks left each chunk's rows a finding.
                    continue
                taken = _manually_paired(other, manual, partial(_holds, spans[other], group, gap))
                key = m.key._replace(positions=gap)  # a record may lack a partner for several stretches: each is a row of its own, named by it
                row = None if taken is not None else set_aside.unaligned(side, m.record, key, gap)
                unaligned.append(row or unaligned_record(side, m.record, NO_PARTNER, taken or f"no {other} record of {m.key.op} holds {span_text(gap)}", key))
    return pairs


def _inside_a_call(gap: Span, spans: list[Span]) -> bool:
    """Whether one of the calls spanning `spans` (sorted) holds every position of `gap`."""
    at = bisect_right(spans, gap[0], key=itemgetter(0))
    return at > 0 and spans[at - 1][0] <= gap[0] and gap[1] <= spans[at - 1][1]


def _ends_a_call(gap: Span, ends: list[int]) -> bool:
    """Whether a call whose end positions are `ends` (sorted) ends on one of `gap`'s positions."""
    at = bisect_right(ends, gap[0])
    return at < len(ends) and ends[at] <= gap[1]


def _overlaps(
    natives: dict[OpGroup, list[Placed]], oracles: dict[OpGroup, list[Placed]]
) -> tuple[list[AlignedPair], dict[str, list[tuple[OpGroup, Span, MappedRecord]]]]:
    """One pair per overlap of a native and an oracle record of each group, in the natives'
    order; and each side's records whose positions the other side does not all hold. A group's
    spans are sorted and disjoint on each side (`_placed`), so a record is held whole exactly
    when its overlaps add up to its length: the positions no record holds are looked for in
    those records alone (looked for in every record, a 240,000-record pair took 0.6 s)."""
    pairs: list[AlignedPair] = []
    short: dict[str, list[tuple[OpGroup, Span, MappedRecord]]] = {"native": [], "oracle": []}
    make_key, make_pair = partial(tuple.__new__, OpKey), partial(tuple.__new__, AlignedPair)
    for group, n_group in natives.items():
        layer, op, occurrence = group
        o_group = oracles.get(group, [])
        o_spans = [o_span for o_span, _ in o_group]
        o_held = [0] * len(o_group)
        j = 0
        for n_span, n in n_group:
            first, stop = n_span
            while j < len(o_spans) and o_spans[j][1] <= first:
                j += 1
            if j < len(o_spans) and o_spans[j] == n_span:
                # Both hold exactly these positions, as every decode step's records do: a pair of whole records.
                o = o_group[j][1]
                key = make_key((n.key.step, n.key.segment, layer, op, occurrence, n_span))
                pairs.append(make_pair((key, n.whole(key), o.whole(key), None)))
                o_held[j] = stop - first
                continue
            k, held = j, 0
            while k < len(o_spans) and o_spans[k][0] < stop:
                o_span, o = o_group[k]
                k += 1
                both = (max(first, o_span[0]), min(stop, o_span[1]))
                key = make_key((n.key.step, n.key.segment, layer, op, occurrence, both))
                pairs.append(make_pair((key, n.cut((both[0] - first, both[1] - first), key), o.cut((both[0] - o_span[0], both[1] - o_span[0]), key), None)))
                held += both[1] - both[0]
                o_held[k - 1] += both[1] - both[0]
            if held < stop - first:
                short["native"].append((group, n_span, n))
        short["oracle"] += [(group, o_span, o) for (o_span, o), held in zip(o_group, o_held) if held < o_span[1] - o_span[0]]
    for group, o_group in oracles.items():
        if group not in natives:
            short["oracle"] += [(group, o_span, o) for o_span, o in o_group]
    return pairs, short


def _holds(spans: dict[int, Span], group: OpGroup, gap: Span, m: MappedRecord) -> bool:
    """Whether `m` is a record of the (layer, op, occurrence) `group` that holds some of `gap`'s positions."""
    return (m.key.layer, m.key.op, m.key.occurrence) == group and m.record.seq in spans and overlap(spans[m.record.seq], gap) is not None


def cut_alike(native_calls: list[Call], oracle_calls: list[Call]) -> bool:
    """Whether both runs made the same forward calls for the prompt and each call both made holds
    the same positions (a run that stops earlier is still cut alike)."""
    prompt = [c for c in native_calls if c.step == 0], [c for c in oracle_calls if c.step == 0]
    spans = call_spans(native_calls, oracle_calls)[1]
    return prompt[0] == prompt[1] and all(spans.get((c.step, c.segment), c.span) == c.span for c in native_calls)


def auto_mode(
    native: Sequence[MappedRecord],
    oracle: Sequence[MappedRecord],
    native_calls: list[Call],
    oracle_calls: list[Call],
    kinds: tuple[MappedKinds | None, MappedKinds | None] = (None, None),
) -> str:
    """Calls when the runs were cut alike (`cut_alike`). Otherwise positions, but
    only when they can be trusted: both runs recorded them, or the prompts are equally long, so
    positions derived from call order mean the same tokens on both sides; else calls, whose
    shape mismatches then say what differs instead of a guess."""
    if cut_alike(native_calls, oracle_calls):
        return CALLS
    prompt = [c for c in native_calls if c.step == 0], [c for c in oracle_calls if c.step == 0]
    if not native or not oracle:
        return CALLS  # nothing pairs: the runs' calls (one list empty) say why, not positions no record holds
    if kinds[0] is not None and kinds[1] is not None:
        recorded = bool((kinds[0].position >= 0).all() and (kinds[1].position >= 0).all())
    else:
        recorded = all(m.record.position >= 0 for m in native) and all(m.record.position >= 0 for m in oracle)
    extent = [max((c.span[1] for c in calls_), default=0) for calls_ in prompt]
    return POSITIONS if recorded or extent[0] == extent[1] else CALLS


CUT_HINT = "; the runs were cut into different calls, and pairing by token position compares what both computed"
"""Said of a record without a partner, or of another shape, when runs cut differently are paired
by calls though their positions can be trusted: "canonical shapes differ" read as a recorder bug,
and nothing said the records were left over from the cut, nor what would pair them."""


def _cut_differently_said(unaligned: list[UnalignedRecord]) -> list[UnalignedRecord]:
    return [replace(u, detail=u.detail + CUT_HINT) if u.reason in (NO_PARTNER, SHAPE_MISMATCH) else u for u in unaligned]


def align(
    native: Sequence[Record],
    oracle: Sequence[Record],
    native_profile: Profile,
    oracle_profile: Profile,
    *,
    native_sources: dict[int, tuple[str, ...]] | None = None,
    oracle_sources: dict[int, tuple[str, ...]] | None = None,
    overrides: tuple[AlignOverride, ...] = (),
    mode: str = "auto",
    native_batch: BatchRow | None = None,
    oracle_batch: BatchRow | None = None,
) -> Alignment:
    """`overrides` are the user's: manual pairs are made first (their records take no part in
    automatic matching), breaks are applied last, and any override naming a record that is not
    there becomes an unaligned row with reason OVERRIDE_MISSING. Of several overrides naming
    the same native record, the last one counts. `mode` is one of ALIGN_MODES; `*_batch` is
    where a batched run keeps the request."""
    # A reason is the user's text, often from a session someone else saved: it reaches the
    # terminal in every finding it explains, so its control characters are escaped once here.
    overrides = tuple(replace(o, reason=printable(o.reason)) for o in _latest(overrides))
    n_run = map_records(native, native_profile, "native", native_sources, native_batch)
    o_run = map_records(oracle, oracle_profile, "oracle", oracle_sources, oracle_batch)
    n_mapped, unaligned, n_optional, n_spans, n_calls, n_keys = n_run[:6]
    o_mapped, o_rejected, o_optional, o_spans, o_calls, o_keys = o_run[:6]
    unaligned.extend(o_rejected)
    rejected = len(unaligned)
    by_position = auto_mode(n_mapped, o_mapped, n_calls, o_calls, (n_run.kinds, o_run.kinds)) == POSITIONS
    chosen = mode if mode != "auto" else POSITIONS if by_position else CALLS
    if chosen == CALLS and not overrides and not n_optional and not o_optional and isinstance(native, Records) and isinstance(oracle, Records):
        found = _pair_by_key_columns(n_run, o_run, unaligned)
        if found is not None:
            if by_position:
                unaligned[:] = _cut_differently_said(unaligned)
            unaligned.sort(key=lambda u: (u.side, u.seq))
            return Alignment(found, unaligned, native_profile.name, oracle_profile.name, chosen, n_calls, o_calls)
        del unaligned[rejected:]
    # What a side records matters only to the other side's optional records (a real run's 480,000 records: 0.05 s).
    n_recorded, o_recorded = _recorded(n_mapped) if o_optional else set(), _recorded(o_mapped) if n_optional else set()
    manual, n_candidates, o_candidates = _take_manual_pairs(overrides, _Candidates(list(n_mapped), n_keys), _Candidates(list(o_mapped), o_keys), native, oracle, unaligned)
    n_candidates = _unless_recorded("native", n_candidates, n_optional, o_recorded, unaligned)
    o_candidates = _unless_recorded("oracle", o_candidates, o_optional, n_recorded, unaligned)
    if chosen == CALLS:
        spans = call_spans(n_calls, o_calls)
        candidates = manual + [_last_logits_rows(p, spans) for p in _pair_by_key(n_candidates, o_candidates, unaligned, manual)]
    else:
        candidates = manual + _pair_by_position(n_candidates.mapped, o_candidates.mapped, {"native": n_spans.by_seq(), "oracle": o_spans.by_seq()}, {"native": n_calls, "oracle": o_calls}, unaligned, manual)
    candidates = _apply_breaks(overrides, candidates, native, unaligned)
    alike = _alike(candidates)
    pairs = candidates if all(alike) else [p for p, same in zip(candidates, alike) if same or _comparable(p, unaligned)]
    pairs = _set_aside_before_mask(pairs, n_spans, o_spans, unaligned)
    if chosen == CALLS and by_position:
        unaligned[:] = _cut_differently_said(unaligned)
    pairs.sort(key=attrgetter("native.record.seq"))
    if manual:
        pairs = _keys_made_unique(pairs)
    unaligned.sort(key=lambda u: (u.side, u.seq))
    return Alignment(pairs, unaligned, native_profile.name, oracle_profile.name, chosen, n_calls, o_calls)


def _keys_made_unique(pairs: list[AlignedPair]) -> list[AlignedPair]:
    """Pairs the user made of records whose key two records claim share that key: each later one
    takes the next occurrence no pair has (`...#1`). Every surface finds a pair by its key: the
    report's first divergence was the second pair, and the window's Ctrl+J went to the first."""
    taken = {pair.key for pair in pairs}
    seen: set[OpKey] = set()
    unique = []
    for pair in pairs:
        if pair.key in seen:
            occurrence = pair.key.occurrence + 1
            while pair.key._replace(occurrence=occurrence) in taken:
                occurrence += 1
            pair = pair._replace(key=pair.key._replace(occurrence=occurrence))
            taken.add(pair.key)
        seen.add(pair.key)
        unique.append(pair)
    return unique
