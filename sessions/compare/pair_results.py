"""Every aligned pair's result as columns, a `PairResult` built only when one is asked for.

A real run has hundreds of thousands of pairs, nearly all bit-identical, and a headless report
reads a handful of them (the first finding, the worst ops): building a `PairResult` per pair
took about half of the judging loop (0.23 of 0.43 s for 240,000 pairs). The judging is done per
distinct (metrics object, post-EOS, contract finding, dispatch difference) with numpy, and each
pair's object is built the first time it is asked for, then kept (so its identity is stable, as
the viewer's maps by `id` need). Iterating builds every pair, as the list did.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter, indexOf
from typing import overload

import numpy as np

from sessions.compare.aligned_pairs import AlignedPair, AlignedPairs
from sessions.compare.key import OpKey
from sessions.compare.tensor_diff import TensorMetrics
from sessions.compare.verdict import Kind


@dataclass(slots=True, weakref_slot=True)
class PairResult:
    """One per aligned pair, by the hundred thousand: slots, no dict each (building 220,000 into
    fresh memory alone: 0.07 s against 0.38 s; within a whole comparison the gain is smaller).
    Weakly referable, so a test can show a dropped window comparison is freed at once."""

    key: OpKey
    native_name: str
    native_seq: int
    oracle_name: str
    oracle_seq: int
    native_layout: str | None
    """The layout transform spec that brought the native record to the canonical layout (None: stored canonical)."""
    oracle_layout: str | None
    metrics: TensorMetrics
    post_eos: bool
    within_tolerance: bool
    verdict: Kind
    """This pair's kind under the one verdict model (sessions.compare.verdict)."""
    manual_reason: str | None = None
    """Set when the user paired these records by hand: their reason."""
    native_window: tuple[int, int] | None = None
    """Rows of the native record's rows axis this pair compares, when it compares part of it (alignment by position)."""
    oracle_window: tuple[int, int] | None = None

    @property
    def label(self) -> str:
        return self.key.label()


class PairResults(Sequence[PairResult]):
    """A comparison's pairs: a list's behaviour, a few arrays' cost until pairs are asked for."""

    def __init__(
        self,
        aligned: list[AlignedPair],
        metrics: list[TensorMetrics],
        post_eos: np.ndarray,
        within: np.ndarray,
        kind_codes: np.ndarray,
        kinds: list[Kind],
        bit_exact: np.ndarray,
    ) -> None:
        self._aligned = aligned
        self._metrics = metrics
        self.post_eos = post_eos
        """Each pair's post-EOS flag (bool array)."""
        self._within = within
        self.kind_codes = kind_codes
        """Each pair's kind, as an index into `kinds`."""
        self.kinds = kinds
        self.bit_exact = bit_exact
        """Each pair's `metrics.bit_exact` (bool array)."""
        self._built: dict[int, PairResult] = {}

    def __len__(self) -> int:
        return len(self._aligned)

    def _make(self, at: int, aligned: AlignedPair, kind: Kind, post_eos: bool, within: bool) -> PairResult:
        key, n, o, manual_reason = aligned
        n_record, o_record, n_layout, o_layout = n.record, o.record, n.layout, o.layout
        return PairResult(
            key, n_record.name, n_record.seq, o_record.name, o_record.seq,
            n_layout.spec if n_layout is not None else None,
            o_layout.spec if o_layout is not None else None,
            self._metrics[at], post_eos, within, kind, manual_reason, n.window, o.window,
        )  # fmt: skip

    def _build(self, at: int) -> PairResult:
        found = self._built.get(at)
        if found is None:
            found = self._built[at] = self._make(at, self._aligned[at], self.kinds[self.kind_codes[at]], bool(self.post_eos[at]), bool(self._within[at]))
        return found

    @overload
    def __getitem__(self, item: int) -> PairResult: ...

    @overload
    def __getitem__(self, item: slice) -> list[PairResult]: ...

    def __getitem__(self, item: int | slice) -> PairResult | list[PairResult]:
        if isinstance(item, slice):
            return [self._build(i) for i in range(*item.indices(len(self)))]
        at = int(item) + len(self) if int(item) < 0 else int(item)
        if not 0 <= at < len(self):
            raise IndexError(f"pair {item} of {len(self)}")
        return self._build(at)

    def __iter__(self) -> Iterator[PairResult]:
        """Every pair, built all at once the first time (a surface that shows every pair): one
        by one, with numpy scalars read per pair, a walk cost more than the list it replaced."""
        if len(self._built) < len(self):
            kinds, post_eos, within = self.verdicts(), self.post_eos.tolist(), self._within.tolist()
            # The aligned pairs walked, not indexed: `AlignedPairs` builds them all in one pass so,
            # and one by one took 1.3 s of a 120,000-pair document against 0.2 s.
            for at, aligned in enumerate(self._aligned):
                if at not in self._built:
                    self._built[at] = self._make(at, aligned, kinds[at], post_eos[at], within[at])
        return map(self._built.__getitem__, range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, PairResults)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def keys(self) -> Iterator[OpKey]:
        """Each pair's key, in order, without building the pairs."""
        return map(attrgetter("key"), self._aligned)

    def index_of_key(self, key: OpKey) -> int | None:
        if isinstance(self._aligned, AlignedPairs):
            return self._aligned.index_of_key(key)
        try:
            return indexOf(self.keys(), key)
        except ValueError:
            return None

    def verdicts(self) -> list[Kind]:
        return np.array(self.kinds, dtype=object)[self.kind_codes].tolist() if len(self) else []


# Helpers for surfaces that look at a few pairs of many: columns for `PairResults`, a walk for a list.


def differing_rows(pairs: Sequence[PairResult]) -> list[int]:
    """Rows of pre-EOS pairs that are not bit-exact, in order."""
    if isinstance(pairs, PairResults):
        return np.flatnonzero(~pairs.post_eos & ~pairs.bit_exact).tolist()
    return [i for i, p in enumerate(pairs) if not p.post_eos and not p.metrics.bit_exact]


def post_eos_differing(pairs: Sequence[PairResult]) -> int:
    if isinstance(pairs, PairResults):
        return int(np.count_nonzero(pairs.post_eos & ~pairs.bit_exact))
    return sum(1 for p in pairs if p.post_eos and not p.metrics.bit_exact)


def first_with_key(pairs: Sequence[PairResult], key: OpKey) -> PairResult | None:
    """The first pair of `key`, found among the keys alone (`operator.indexOf`, in C)."""
    if isinstance(pairs, PairResults):
        at = pairs.index_of_key(key)
        return None if at is None else pairs[at]
    try:
        return pairs[indexOf(map(attrgetter("key"), pairs), key)]
    except ValueError:
        return None


def pair_kinds(pairs: Sequence[PairResult]) -> list[Kind]:
    return pairs.verdicts() if isinstance(pairs, PairResults) else [r.verdict for r in pairs]
