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

from sessions.capture.columns import Coded
from sessions.compare.record_columns import groups

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
        if stop <= first:
            return f"{self.segment} (no rows)"  # an empty call holds no position: "text-before 0" named one
        return f"{self.segment} {first}-{stop - 1}" if stop - first > 1 else f"{self.segment} {first}"


class RecordSpans:
    """Each record's positions, by seq (`record_spans`), made a dict only when asked: runs paired
    by calls look up few spans or none, and a dict of a 240,000-record run's spans took 0.05 s."""

    def __init__(self, seq: np.ndarray, first: np.ndarray, stop: np.ndarray, call: np.ndarray) -> None:
        self._columns = seq, first, stop, call
        self._by_seq: dict[int, Span] | None = None

    def by_seq(self) -> dict[int, Span]:
        """The spans by seq, built on the first call and kept (runs paired by position look up every record's)."""
        if self._by_seq is None:
            seq, first, stop, call = self._columns
            self._by_seq = dict(zip(seq.tolist(), zip(first.tolist(), stop.tolist())))
            if len(self._by_seq) < len(seq):
                # A seq given twice (only a broken index has one): the last in call order holds, as it
                # did when records were visited call by call.
                by_call = np.argsort(call, kind="stable")
                self._by_seq = dict(zip(seq[by_call].tolist(), zip(first[by_call].tolist(), stop[by_call].tolist())))
        return self._by_seq

    @classmethod
    def none(cls) -> RecordSpans:
        """The spans of a run without records (a new object each time: `by_seq` keeps what it built)."""
        return cls(*(np.zeros(0, dtype=np.int64),) * 4)


def record_spans(seq: np.ndarray, step: np.ndarray, segment: Coded[str], rows: np.ndarray, position: np.ndarray) -> tuple[RecordSpans, list[Call]]:
    """Each record's positions, by seq, and the run's forward calls in execution order, each
    spanning its records' positions. One array element per record whose canonical shape says
    which axis holds its positions (`record_mapping.map_records` keeps them in execution order): `rows`
    is how many positions it holds, `position` the recorded first one (-1: not recorded).

    A record's positions are recorded, or derived from the order of the calls: calls (step,
    segment) follow one another in execution order, each as long as its longest record; a
    record as long as its call starts where the call starts, a shorter one (the logits of the
    last row) ends where the call ends."""
    if not len(seq):
        return RecordSpans.none(), []
    calls = groups(step, segment.codes)
    order = np.argsort(calls.first, kind="stable")  # the calls in execution order: by their first record
    call = np.empty(len(order), dtype=np.int64)
    call[order] = np.arange(len(order))
    call = call[calls.of_row]
    opening = calls.first[order]  # each call's first record
    # Python integers where recorded positions or summed lengths could pass int64 (a hostile index).
    reach = max(abs(int(position.min())), abs(int(position.max()))) + max(abs(int(rows.min())), abs(int(rows.max()))) * (len(rows) + 1)
    if reach >= 1 << 62:
        rows, position = rows.astype(object), position.astype(object)
    length = rows[opening].copy()
    np.maximum.at(length, call, rows)
    start = _call_starts(call, length, rows, position, step[opening])
    first = np.where(position >= 0, position, start[call] + length[call] - rows)
    stop = first + rows
    low, high = first[opening].copy(), stop[opening].copy()
    np.minimum.at(low, call, first)
    np.maximum.at(high, call, stop)
    spans = RecordSpans(seq, first, stop, call)
    made = [Call(int(step[at]), segment.values[segment.codes[at]], (int(a), int(b))) for at, a, b in zip(opening.tolist(), low.tolist(), high.tolist())]
    return spans, made


def _call_starts(call: np.ndarray, length: np.ndarray, rows: np.ndarray, position: np.ndarray, call_step: np.ndarray) -> np.ndarray:
    """Where each call starts: where its recorded positions put it, or, not recorded, where the
    call before it ended, and a decode step `s` no earlier than `prompt length + s - 1`
    (docs/capture-format.md, "Positions"). Counted from 0 whatever earlier calls had recorded, a
    run whose prompt was recorded at positions 40-82 (after a cached prefix) placed decode step 1
    at 43, inside the prompt; placed after the call before alone, a run that lacks step 2 put
    step 3 on step 2's position, and a prompt recorded out of order put the decode steps inside it.

    A recorded record places its call as an unrecorded one would be placed around it: one as long
    as its call at the call's start, a shorter one (the logits of the last row) at its end. Taken
    as the call's start, a call whose logits alone were recorded began on its last row."""
    recorded = np.flatnonzero(position >= 0)
    has = np.zeros(len(length), dtype=bool)
    has[call[recorded]] = True
    low = np.full(len(length), -1, dtype=position.dtype)
    high = np.full(len(length), -1, dtype=position.dtype)
    if recorded.size:
        placed = position[recorded] - (length[call[recorded]] - rows[recorded])
        low[call[recorded]] = placed  # any recorded first of the call, lowered next
        np.minimum.at(low, call[recorded], placed)
        np.maximum.at(high, call[recorded], position[recorded] + rows[recorded])
    starts: list[int] = []
    end = 0
    prompt_end: int | None = None
    for recorded_here, lowest, highest, long, step in zip(has.tolist(), low.tolist(), high.tolist(), length.tolist(), call_step.tolist()):
        at = lowest if recorded_here else end if step == 0 or prompt_end is None else max(end, prompt_end + step - 1)
        starts.append(at)
        end = max(at + long, highest) if recorded_here else at + long
        if step == 0:
            prompt_end = end if prompt_end is None else max(prompt_end, end)
    return np.array(starts, dtype=rows.dtype)


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
