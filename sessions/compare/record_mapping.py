"""Each record of a run mapped to its canonical op and shape under its profile, or refused with why.

A record's mapping depends only on its kind (name, occurrence, how many share its call, kernel,
sources, layer, shape), which repeats every token step: a real run has hundreds of thousands of
records and a few thousand kinds, so each kind is mapped once, on the records' columns
(`sessions.compare.record_columns`). Pairing the mapped records is `sessions.compare.align`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import repeat
from typing import NamedTuple, overload

import numpy as np

from sessions.capture.columns import Coded
from sessions.capture.reader import Record
from sessions.compare.key import OpKey
from sessions.compare.layout_transform import LayoutError, LayoutTransform
from sessions.compare.mapped_record import BatchRow, MappedRecord, canonical_shape
from sessions.compare.positions import Call, RecordSpans, record_spans
from sessions.compare.profiles import Profile, RuleMatch, canonical_axes, rows_axis
from sessions.compare.record_columns import KeyColumns, groups, record_columns
from sessions.compare.unaligned import (
    LAYER_CONFLICT,
    LAYOUT,
    NO_RULE,
    NOT_BATCHED,
    ONE_SIDED,
    UnalignedRecord,
    unaligned_record,
)


class _Mapping(NamedTuple):
    """What a profile makes of one kind of record: the same for every token step's record of that
    kind, so it is worked out once per kind (`_KindOfRecord`), not once per record."""

    op: str
    occurrence: int
    layer: int
    layout: LayoutTransform | None
    shape: tuple[int, ...]
    one_sided: str | None
    refusal: tuple[str, str] | None = None
    """(reason, detail) when records of this kind are unaligned."""
    keyed: bool = False
    """Whether a refused record still has its canonical key (the profile mapped it, its layout did not fit)."""


_KindOfRecord = tuple[str, int, int, str, tuple[str, ...], int, tuple[int, ...]]
"""(name, occurrence, count, kernel, sources, layer, shape): all a record's mapping depends on."""


def _mapping(profile: Profile, match: RuleMatch | None, kind: _KindOfRecord, batch: BatchRow | None) -> _Mapping:
    """What `match` (the profile's rule for the kind's name, occurrence, count, kernel and sources) makes of records of `kind`."""
    name, occurrence, count, _, _, layer, shape = kind
    if match is not None and match.one_sided is not None and not match.op:
        return _Mapping("", 0, layer, None, (), None, (ONE_SIDED, match.one_sided))
    if match is None:
        detail = f"profile {profile.name!r} has no rule for {name!r} occurrence {occurrence} of {count}"
        return _Mapping("", 0, layer, None, (), None, (NO_RULE, detail))
    if match.layer is not None and match.layer != layer:
        if layer != -1:
            return _Mapping("", 0, layer, None, (), None, (LAYER_CONFLICT, f"name says layer {match.layer}, record says {layer}"))
        layer = match.layer
    refused = _Mapping(match.op, match.occurrence, layer, None, (), None, keyed=True)
    if batch is not None and (not shape or shape[0] != batch.size):
        axis0 = shape[0] if shape else "a scalar"
        return refused._replace(refusal=(NOT_BATCHED, f"its stored axis 0 is {axis0}, not the run's batch of {batch.size}"))
    try:
        canonical = canonical_shape(shape, match.layout, batch)
    except LayoutError as exc:
        return refused._replace(refusal=(LAYOUT, str(exc)))
    return _Mapping(match.op, match.occurrence, layer, match.layout, canonical, match.one_sided)


class MappedRun(NamedTuple):
    """A side's records as its profile maps them (`map_records`)."""

    mapped: Sequence[MappedRecord]
    """Built on first use (`LazyMapped`): pairing by key works on `keys` and `kinds` alone."""
    rejected: list[UnalignedRecord]
    """Records without a canonical key or shape, and why."""
    optional: dict[int, str]
    """seq -> why the other engine may not record it, for records of optional stages (`_unless_recorded`)."""
    spans: RecordSpans
    """Each mapped record's token positions, by seq (`record_spans`)."""
    calls: list[Call]
    """The run's forward calls in execution order (`record_spans`)."""
    keys: KeyColumns
    """The mapped records' keys as columns, row for row with `mapped`."""
    kinds: MappedKinds | None = None
    """The mapped records' rows and kinds as columns, row for row with `mapped` (None: not from columns)."""


class MappedKinds(NamedTuple):
    """Columns of the mapped records: which index row each is, and its kind's mapping."""

    records: Sequence[Record]
    rows: np.ndarray
    """Each mapped record's row in `records`."""
    kind_of: np.ndarray
    """Each mapped record's kind (into `mappings`)."""
    mappings: list[_Mapping]
    batch: BatchRow | None
    position: np.ndarray

    def one(self, at: int, key: OpKey | None = None) -> MappedRecord:
        """Mapped record `at` alone (a record without a partner, a pair asked for)."""
        m = self.mappings[int(self.kind_of[at])]
        record = self.records[int(self.rows[at])]
        if key is None:
            key = OpKey(record.step, record.segment, m.layer, m.op, m.occurrence)
        return tuple.__new__(MappedRecord, (record, key, m.layout, m.shape, None, self.batch))


class LazyMapped(Sequence[MappedRecord]):
    """A side's mapped records, every one built the first time any is asked for."""

    def __init__(self, build: Callable[[], list[MappedRecord]], count: int) -> None:
        self._build: Callable[[], list[MappedRecord]] | None = build
        self._count = count
        self._list: list[MappedRecord] | None = None

    def _every(self) -> list[MappedRecord]:
        if self._list is None:
            assert self._build is not None
            self._list, self._build = self._build(), None
        return self._list

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, item: int) -> MappedRecord: ...

    @overload
    def __getitem__(self, item: slice) -> list[MappedRecord]: ...

    def __getitem__(self, item: int | slice) -> MappedRecord | list[MappedRecord]:
        return self._every()[item]

    def __iter__(self) -> Iterator[MappedRecord]:
        return iter(self._every())


def _source_codes(seqs: np.ndarray, sources: dict[int, tuple[str, ...]]) -> Coded[tuple[str, ...]]:
    """Each record's source names (`sources`, by seq; none when absent) as codes."""
    if not sources:
        return Coded([()], np.zeros(len(seqs), dtype=np.int64))
    return Coded.of([sources.get(seq, ()) for seq in seqs.tolist()])


def _position_rows(mapping: _Mapping) -> int | None:
    """How many token positions a record of this mapping holds: its canonical rows; None when its
    canonical shape has another rank than its op's axes, so which axis holds them is unknown."""
    if mapping.refusal is not None or len(mapping.shape) != len(canonical_axes(mapping.op)):
        return None
    return mapping.shape[rows_axis(mapping.op)]


def _integers(values: list[int]) -> np.ndarray:
    """int64, or Python integers where a hostile shape's canonical rows do not fit one."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def map_records(
    records: Sequence[Record],
    profile: Profile,
    side: str,
    sources: dict[int, tuple[str, ...]] | None = None,
    batch: BatchRow | None = None,
) -> MappedRun:
    """Each record's canonical key and shape under `profile`, or why it has none; the records of
    optional stages; and each record's token positions and the run's calls (`record_spans`).

    `sources` (seq -> source tensor names, `sessions.compare.record_sources`) feeds rules that anchor
    a record by what it consumes. A record's mapping depends only on its kind (`_KindOfRecord`),
    which repeats every token step, so each kind is mapped once (a capture of a real model has
    hundreds of thousands of records, a few thousand kinds). The kinds are found with numpy on
    the records' columns (`record_columns`); only the keys and mapped records are built per
    record, by `map` over the columns. `batch` is where a batched run, whose records hold the
    batch along stored axis 0, keeps the request compared."""
    columns = record_columns(records)
    if not len(columns):
        return MappedRun([], [], {}, RecordSpans.none(), [], KeyColumns.none())
    name, occurrence, kernel, layer, shape = columns.name, columns.occurrence, columns.kernel_id, columns.layer, columns.shape
    calls_of = groups(columns.step, columns.segment.codes, layer, name.codes)  # (step, segment, layer, name)
    count = calls_of.sizes[calls_of.of_row]
    sources_of = _source_codes(columns.seq, sources or {})
    kinds = groups(name.codes, occurrence, count, kernel.codes, sources_of.codes, layer, shape.codes)
    matches: dict[tuple[str, int, int, str, tuple[str, ...]], RuleMatch | None] = {}
    mappings: list[_Mapping] = []
    first = kinds.first
    each_kind = zip(name.taken(first), occurrence[first].tolist(), count[first].tolist(), kernel.taken(first), sources_of.taken(first), layer[first].tolist(), shape.taken(first))
    for kind in each_kind:
        asked = kind[:5]  # shapes that grow every step (attention scores) make kinds, not rules
        if asked not in matches:
            matches[asked] = profile.match(*asked)
        mappings.append(_mapping(profile, matches[asked], kind, batch))
    kind_of = kinds.of_row
    refused = np.array([m.refusal is not None for m in mappings], dtype=bool)[kind_of]
    rejected: list[UnalignedRecord] = []
    kept: np.ndarray | None = None
    if refused.any():
        for row in np.flatnonzero(refused).tolist():
            record, m = records[row], mappings[kind_of[row]]
            assert m.refusal is not None
            rejected.append(unaligned_record(side, record, *m.refusal, OpKey(record.step, record.segment, m.layer, m.op, m.occurrence) if m.keyed else None))
        kept = np.flatnonzero(~refused)
        kind_of = kind_of[kept]
    rows_kept = kept if kept is not None else np.arange(len(columns))
    per_kind = list(zip(*mappings))
    key_columns = KeyColumns(
        columns.step if kept is None else columns.step[kept],
        columns.segment if kept is None else columns.segment.rows(kept),
        _integers(list(per_kind[2]))[kind_of],
        Coded(list(per_kind[0]), kind_of),
        _integers(list(per_kind[1]))[kind_of],
    )

    def build() -> list[MappedRecord]:
        every = records if isinstance(records, list) else list(records)
        if kept is not None:
            every = [every[row] for row in kept.tolist()]
        make_key, make_mapped = partial(tuple.__new__, OpKey), partial(tuple.__new__, MappedRecord)
        key_fields = (key_columns.step.tolist(), key_columns.segment.taken(), key_columns.layer.tolist(), key_columns.op.taken(), key_columns.occurrence.tolist())
        keys = map(make_key, zip(*key_fields, repeat(())))
        layouts, canonical = Coded(list(per_kind[3]), kind_of).taken(), Coded(list(per_kind[4]), kind_of).taken()
        return list(map(make_mapped, zip(every, keys, layouts, canonical, repeat(None), repeat(batch))))

    mapped = LazyMapped(build, len(rows_kept))
    seqs = columns.seq if kept is None else columns.seq[kept]
    optional: dict[int, str] = {}
    one_sided = np.array([m.one_sided is not None for m in mappings], dtype=bool)[kind_of]
    for row in np.flatnonzero(one_sided).tolist():
        one = mappings[kind_of[row]].one_sided
        assert one is not None
        optional[int(seqs[row])] = one
    rows = [_position_rows(m) for m in mappings]
    spanned = np.array([r is not None for r in rows], dtype=bool)[kind_of]
    at = np.flatnonzero(spanned) if kept is None else kept[spanned]
    held = _integers([r or 0 for r in rows])[kind_of[spanned]]
    spans, calls = record_spans(columns.seq[at], columns.step[at], columns.segment.rows(at), held, columns.position[at])
    kinds_columns = MappedKinds(records, rows_kept, kind_of, mappings, batch, columns.position[rows_kept])
    return MappedRun(mapped, rejected, optional, spans, calls, key_columns, kinds_columns)
