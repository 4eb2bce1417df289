"""Pairing native and oracle records by (step, segment, layer, canonical op, occurrence).

Alignment never guesses: a key held by two records of one side is an error for both (and
for their would-be partner), and every record that ends up without a pair is listed with
its reason. Only index metadata is used here -- no tensor bytes are read.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from sessions.capture_reader import Record
from sessions.layout_transform import LayoutError, LayoutTransform
from sessions.profiles import Profile

NO_RULE = "no_rule"
LAYER_CONFLICT = "layer_conflict"
LAYOUT = "layout"
NO_PARTNER = "no_partner"
DUPLICATE_KEY = "duplicate_key"
SHAPE_MISMATCH = "shape_mismatch"
DTYPE_MISMATCH = "dtype_mismatch"
ONE_SIDED = "one_sided"
"""A stage the profile knows the other engine has no tensor for (KV-cache views, kq, ...)."""


@dataclass(frozen=True, order=True)
class AlignKey:
    step: int
    segment: str
    layer: int
    op: str
    occurrence: int

    def label(self) -> str:
        layer = "" if self.layer < 0 else f" layer {self.layer}"
        occ = f"#{self.occurrence}" if self.occurrence else ""
        return f"step {self.step} {self.segment}{layer} {self.op}{occ}"


@dataclass(frozen=True)
class MappedRecord:
    record: Record
    key: AlignKey
    layout: LayoutTransform | None
    shape: tuple[int, ...]
    """The canonical shape, after the layout transform."""


@dataclass(frozen=True)
class AlignedPair:
    key: AlignKey
    native: MappedRecord
    oracle: MappedRecord


@dataclass(frozen=True)
class UnalignedRecord:
    side: str
    seq: int
    name: str
    step: int
    segment: str
    layer: int
    occurrence: int
    reason: str
    detail: str
    key: AlignKey | None = None


@dataclass
class Alignment:
    pairs: list[AlignedPair]
    """In the native engine's execution order (record sequence)."""
    unaligned: list[UnalignedRecord]
    native_profile: str
    oracle_profile: str


def _unaligned(side: str, record: Record, reason: str, detail: str, key: AlignKey | None = None) -> UnalignedRecord:
    return UnalignedRecord(
        side, record.seq, record.name, record.step, record.segment, record.layer, record.occurrence, reason, detail, key
    )


def map_records(
    records: list[Record], profile: Profile, side: str, sources: dict[int, tuple[str, ...]] | None = None
) -> tuple[list[MappedRecord], list[UnalignedRecord]]:
    """Each record's canonical key and shape under `profile`, or why it has none.

    `sources` (seq -> source tensor names, `sessions.record_sources`) feeds rules that anchor
    a record by what it consumes."""
    sources = sources or {}
    counts = Counter((r.step, r.segment, r.layer, r.name) for r in records)
    mapped: list[MappedRecord] = []
    rejected: list[UnalignedRecord] = []
    for record in records:
        count = counts[(record.step, record.segment, record.layer, record.name)]
        match = profile.match(record.name, record.occurrence, count, record.kernel_id, sources.get(record.seq, ()))
        if match is not None and match.one_sided is not None:
            rejected.append(_unaligned(side, record, ONE_SIDED, match.one_sided))
            continue
        if match is None:
            rejected.append(
                _unaligned(
                    side,
                    record,
                    NO_RULE,
                    f"profile {profile.name!r} has no rule for {record.name!r} occurrence {record.occurrence} of {count}",
                )
            )
            continue
        layer = record.layer
        if match.layer is not None and match.layer != record.layer:
            if record.layer != -1:
                rejected.append(
                    _unaligned(side, record, LAYER_CONFLICT, f"name says layer {match.layer}, record says {record.layer}")
                )
                continue
            layer = match.layer
        key = AlignKey(record.step, record.segment, layer, match.op, match.occurrence)
        try:
            shape = match.layout.output_shape(record.shape) if match.layout else record.shape
        except LayoutError as exc:
            rejected.append(_unaligned(side, record, LAYOUT, str(exc), key))
            continue
        mapped.append(MappedRecord(record, key, match.layout, shape))
    return mapped, rejected


def _by_key(mapped: list[MappedRecord]) -> tuple[dict[AlignKey, MappedRecord], dict[AlignKey, list[MappedRecord]]]:
    groups: dict[AlignKey, list[MappedRecord]] = defaultdict(list)
    for m in mapped:
        groups[m.key].append(m)
    unique = {k: v[0] for k, v in groups.items() if len(v) == 1}
    duplicates = {k: v for k, v in groups.items() if len(v) > 1}
    return unique, duplicates


def align(
    native: list[Record],
    oracle: list[Record],
    native_profile: Profile,
    oracle_profile: Profile,
    *,
    native_sources: dict[int, tuple[str, ...]] | None = None,
    oracle_sources: dict[int, tuple[str, ...]] | None = None,
) -> Alignment:
    n_mapped, unaligned = map_records(native, native_profile, "native", native_sources)
    o_mapped, o_rejected = map_records(oracle, oracle_profile, "oracle", oracle_sources)
    unaligned.extend(o_rejected)
    n_unique, n_dupes = _by_key(n_mapped)
    o_unique, o_dupes = _by_key(o_mapped)
    for side, dupes, other in (("native", n_dupes, o_unique), ("oracle", o_dupes, n_unique)):
        for key, group in dupes.items():
            names = ", ".join(f"{m.record.name!r} (seq {m.record.seq})" for m in group)
            for m in group:
                unaligned.append(_unaligned(side, m.record, DUPLICATE_KEY, f"{key.label()} is claimed by {names}", key))
            partner = other.pop(key, None)
            if partner is not None:
                other_side = "oracle" if side == "native" else "native"
                unaligned.append(
                    _unaligned(other_side, partner.record, DUPLICATE_KEY, f"its partner key {key.label()} is ambiguous on the {side} side", key)
                )
    pairs: list[AlignedPair] = []
    for key, n in n_unique.items():
        o = o_unique.pop(key, None)
        if o is None:
            if key not in o_dupes:
                unaligned.append(_unaligned("native", n.record, NO_PARTNER, f"no oracle record for {key.label()}", key))
            continue
        problem = None
        if n.shape != o.shape:
            problem = (SHAPE_MISMATCH, f"canonical shapes differ: native {list(n.shape)} vs oracle {list(o.shape)}")
        elif n.record.dtype != o.record.dtype:
            problem = (DTYPE_MISMATCH, f"dtypes differ: native {n.record.dtype} vs oracle {o.record.dtype}")
        if problem is not None:
            unaligned.append(_unaligned("native", n.record, problem[0], problem[1], key))
            unaligned.append(_unaligned("oracle", o.record, problem[0], problem[1], key))
            continue
        pairs.append(AlignedPair(key, n, o))
    for key, o in o_unique.items():
        if key not in n_dupes:
            unaligned.append(_unaligned("oracle", o.record, NO_PARTNER, f"no native record for {key.label()}", key))
    pairs.sort(key=lambda p: p.native.record.seq)
    unaligned.sort(key=lambda u: (u.side, u.seq))
    return Alignment(pairs, unaligned, native_profile.name, oracle_profile.name)
