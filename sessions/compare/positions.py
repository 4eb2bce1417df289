"""Which token positions each record's rows hold, and how a run was cut into forward calls.

Two runs of one prompt may split it differently: one combined prefill against three
cache-preserving segments, llama.cpp micro-batches, the prompt's tail fed token by token. A
record's rows are then positions `start .. start + rows - 1`, where `start` is what the
recorder wrote (the index field `position`) or, in files without it, what the order of the
calls implies (docs/capture-format.md, "Positions").
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from operator import itemgetter

from sessions.compare.mapped_record import MappedRecord
from sessions.compare.profiles import canonical_axes, rows_axis

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


def record_spans(mapped: list[MappedRecord]) -> tuple[dict[int, Span], list[Call]]:
    """Each record's positions, by seq, and the run's forward calls in execution order, each
    spanning its records' positions. `mapped` is in execution order, as `map_records` returns it.

    A record's positions are recorded, or derived from the order of the calls: calls (step,
    segment) follow one another in execution order, each as long as its longest record; a
    record as long as its call starts where the call starts, a shorter one (the logits of the
    last row) ends where the call ends."""
    by_call: dict[tuple[int, str], list[tuple[int, int, int]]] = {}
    axes: dict[str, tuple[int, int]] = {}
    for record, key, _, shape, *_ in mapped:
        op = key.op
        axis_rank = axes.get(op)
        if axis_rank is None:
            axis_rank = axes[op] = (rows_axis(op), len(canonical_axes(op)))
        axis, rank = axis_rank
        if len(shape) != rank:
            continue  # which axis holds the positions is unknown: it has no span (`align._placed` says why)
        call = record[1:3]  # (step, segment)
        held = by_call.get(call)
        if held is None:
            held = by_call[call] = []
        held.append((record.seq, shape[axis], record.position))
    spans: dict[int, Span] = {}
    found: list[Call] = []
    start = 0
    for (step, segment), records in by_call.items():
        length = max(rows for _, rows, _ in records)
        low, high = None, None
        for seq, rows, position in records:
            first = position if position >= 0 else (start if rows == length else start + length - rows)
            spans[seq] = (first, first + rows)
            low = first if low is None or first < low else low
            high = first + rows if high is None or first + rows > high else high
        assert low is not None and high is not None
        found.append(Call(step, segment, (low, high)))
        start += length
    return spans, found


def overlap(a: Span, b: Span) -> Span | None:
    first, stop = max(a[0], b[0]), min(a[1], b[1])
    return (first, stop) if first < stop else None


def uncovered(span: Span, covered: list[Span]) -> list[Span]:
    """The parts of `span` no span of `covered` (sorted, disjoint) holds. Only the spans that
    overlap it are visited: a walk of them all, for each record of a 240,000-record run cut
    differently, took 65 s."""
    gaps: list[Span] = []
    at = span[0]
    for index in range(bisect_right(covered, span[0], key=itemgetter(1)), len(covered)):
        first, stop = covered[index]
        if first >= span[1]:
            break
        if first > at:
            gaps.append((at, first))
        at = max(at, stop)
    if at < span[1]:
        gaps.append((at, span[1]))
    return gaps


def span_text(span: Span) -> str:
    return f"position {span[0]}" if span[1] - span[0] == 1 else f"positions {span[0]}-{span[1] - 1}"
