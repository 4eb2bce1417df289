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

import numpy as np

from sessions.compare.record_columns import Coded, groups

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


def record_spans(seq: np.ndarray, step: np.ndarray, segment: Coded[str], rows: np.ndarray, position: np.ndarray) -> tuple[dict[int, Span], list[Call]]:
    """Each record's positions, by seq, and the run's forward calls in execution order, each
    spanning its records' positions. One array element per record, in execution order (as
    `align.map_records` keeps them): `rows` is how many positions a record holds (its canonical
    rows; -1 when which axis holds them is unknown: it has no span, and `align._placed` says
    why), `position` the recorded first position (-1: not recorded).

    A record's positions are recorded, or derived from the order of the calls: calls (step,
    segment) follow one another in execution order, each as long as its longest record; a
    record as long as its call starts where the call starts, a shorter one (the logits of the
    last row) ends where the call ends."""
    held = np.flatnonzero(rows >= 0)
    if not len(held):
        return {}, []
    seq, step, codes, rows, position = seq[held], step[held], segment.codes[held], rows[held], position[held]
    calls = groups(step, codes)
    order = np.argsort(calls.first, kind="stable")  # the calls in execution order: by their first record
    call = np.empty(len(order), dtype=np.int64)
    call[order] = np.arange(len(order))
    call = call[calls.of_row]
    # Python integers where recorded positions or summed lengths could pass int64.
    wide = int(position.max()) + int(rows.max()) * len(rows) >= 1 << 62
    rows, position = (rows.astype(object), position.astype(object)) if wide else (rows, position)
    length = np.zeros(len(order), dtype=rows.dtype)
    np.maximum.at(length, call, rows)
    start = np.concatenate((np.zeros(1, dtype=rows.dtype), np.cumsum(length)[:-1]))
    first = np.where(position >= 0, position, start[call] + length[call] - rows)
    stop = first + rows
    low, high = first[calls.first[order]].copy(), stop[calls.first[order]].copy()
    np.minimum.at(low, call, first)
    np.maximum.at(high, call, stop)
    spans = dict(zip(seq.tolist(), zip(first.tolist(), stop.tolist())))
    firsts = calls.first[order].tolist()
    found = [Call(int(step[at]), segment.values[codes[at]], (int(a), int(b))) for at, a, b in zip(firsts, low.tolist(), high.tolist())]
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
