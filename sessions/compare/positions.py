"""Which token positions each record's rows hold, and how a run was cut into forward calls.

Two runs of one prompt may split it differently: one combined prefill against three
cache-preserving segments, llama.cpp micro-batches, the prompt's tail fed token by token. A
record's rows are then positions `start .. start + rows - 1`, where `start` is what the
recorder wrote (the index field `position`) or, in files without it, what the order of the
calls implies (docs/capture-format.md, "Positions").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sessions.compare.mapped_record import MappedRecord
from sessions.compare.profiles import rows_axis

Span = tuple[int, int]
"""Token positions [first, stop)."""


@dataclass(frozen=True)
class Call:
    """One forward call of a run: a (step, segment) and the positions its longest record covers."""

    step: int
    segment: str
    span: Span

    def text(self) -> str:
        first, stop = self.span
        return f"{self.segment} {first}-{stop - 1}" if stop - first > 1 else f"{self.segment} {first}"


def _rows(mapped: MappedRecord) -> int:
    return mapped.shape[rows_axis(mapped.key.op)] if mapped.shape else 1


def record_spans(mapped: list[MappedRecord]) -> dict[int, Span]:
    """Each record's positions, by seq: recorded, or derived from the order of the calls. `mapped`
    is in execution order, as `map_records` returns it.

    Derived: calls (step, segment) follow one another in execution order, each as long as its
    longest record; a record as long as its call starts where the call starts, a shorter one
    (the logits of the last row) ends where the call ends."""
    by_call: dict[tuple[int, str], list[MappedRecord]] = defaultdict(list)
    for m in mapped:
        by_call[(m.record.step, m.record.segment)].append(m)
    spans: dict[int, Span] = {}
    start = 0
    for records in by_call.values():
        length = max(_rows(m) for m in records)
        for m in records:
            rows = _rows(m)
            if m.record.position >= 0:
                spans[m.record.seq] = (m.record.position, m.record.position + rows)
            else:
                first = start if rows == length else start + length - rows
                spans[m.record.seq] = (first, first + rows)
        start += length
    return spans


def calls(mapped: list[MappedRecord], spans: dict[int, Span]) -> list[Call]:
    """The run's forward calls in execution order, each spanning its records' positions."""
    found: dict[tuple[int, str], Span] = {}
    for m in mapped:
        call = (m.record.step, m.record.segment)
        first, stop = spans[m.record.seq]
        if call in found:
            first, stop = min(first, found[call][0]), max(stop, found[call][1])
        found[call] = (first, stop)
    return [Call(step, segment, span) for (step, segment), span in found.items()]


def overlap(a: Span, b: Span) -> Span | None:
    first, stop = max(a[0], b[0]), min(a[1], b[1])
    return (first, stop) if first < stop else None


def uncovered(span: Span, covered: list[Span]) -> list[Span]:
    """The parts of `span` no span of `covered` (sorted, disjoint) holds."""
    gaps: list[Span] = []
    at = span[0]
    for first, stop in covered:
        if first > at:
            gaps.append((at, min(first, span[1])))
        at = max(at, stop)
    if at < span[1]:
        gaps.append((at, span[1]))
    return [g for g in gaps if g[0] < g[1]]


def span_text(span: Span) -> str:
    return f"position {span[0]}" if span[1] - span[0] == 1 else f"positions {span[0]}-{span[1] - 1}"
