"""One aligned pair's tensors through the diff engine, chunk by chunk, and a run of pairs in order.

The same code compares pairs in the comparison's own process and in parallel workers
(sessions.compare.parallel_compare): a pair's outcome is its metrics and, for a logits pair, the
agreement of the row its step's token comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from sessions.bits.dtypes import logical_dtype, quantized_nbytes
from sessions.capture.reader import stored_span
from sessions.compare.aligned_pairs import AlignedPair, AlignedPairs
from sessions.compare.byte_checks import STRETCH_BYTES, Check
from sessions.compare.options import CompareOptions
from sessions.compare.pair_reader import (
    PairReader,
    RecordSeqs,
    chunk_rows,
    last_reads,
    pair_byte_counts,
    pair_bytes,
    record_seqs,
)
from sessions.compare.profiles import CANONICAL_OPS, HEADS_SOURCE
from sessions.compare.tensor_diff import DiffAccumulator, TensorMetrics
from sessions.compare.token_parity import StepLogits, logit_agreement
from sessions.progress import Progress, ProgressGenerator

Heads = dict[tuple[int, str, int, str], int]
"""Head counts per (step, segment, layer, op), for per-head profiles of merged (heads dim) axes."""
PairOutcome = tuple[TensorMetrics, StepLogits | None]


def _axes(pair: AlignedPair, heads: Heads) -> tuple[int | None, tuple[int, int] | None]:
    """Canonical rows axis and (axis, head count) of a pair, for its per-row/per-head profiles."""
    layout = CANONICAL_OPS[pair.key.op]
    shape = pair.native.shape
    if logical_dtype(pair.native.record.dtype).is_quantized or len(shape) < 2:
        return None, None
    if layout.startswith("heads") and len(shape) == 3:
        return 1, (0, shape[0])
    if "(heads dim)" in layout:
        for source in (f"dispatch:{pair.key.op}", *HEADS_SOURCE.get(pair.key.op, ())):
            n = heads.get((pair.key.step, pair.key.segment, pair.key.layer, source))
            if n and shape[1] % n == 0:
                return 0, (1, n)
    return 0, None


class _LogitRows:
    """The last canonical row of each side of a logits pair: the row the step's token comes from."""

    def __init__(self) -> None:
        self.native: np.ndarray | None = None
        self.oracle: np.ndarray | None = None

    def keep(self, native: np.ndarray, oracle: np.ndarray, rows: tuple[int, int], total_rows: int) -> None:
        if rows[1] == total_rows and native.ndim == 2:
            self.native, self.oracle = native[-1].copy(), oracle[-1].copy()


PROGRESS_BYTES = 2 * STRETCH_BYTES
"""Settled runs report progress once this many bytes (both sides) have been settled since the last report."""
RUN_RECORD_MAX_BYTES = 64 * 1024
"""Records up to this size are settled in runs (`_runs`): for them a record's own
check and reads cost more than its bytes. A run whose bytes differ is compared again pair by
pair, so its records are read twice: cheap for small ones only."""


def _whole_and_alike(pair: AlignedPair) -> bool:
    """Both sides whole records of one dtype, shape and layout transform: equal stored bytes then
    mean equal canonical tensors. Logits pairs are never settled so: their rows feed token parity."""
    native, oracle = pair.native, pair.oracle
    return not (
        pair.key.op == "logits"
        or native.window is not None
        or oracle.window is not None
        or native.batch is not None
        or oracle.batch is not None
        or native.record.dtype != oracle.record.dtype
        or native.record.shape != oracle.record.shape
        or native.layout != oracle.layout
    )


class _Run(NamedTuple):
    """Pairs `start` to `start + count` whose stored bytes are one stretch on each side (`check`)."""

    start: int
    count: int
    check: Check


def _runs(pairs: list[AlignedPair], reader: PairReader, seqs: RecordSeqs) -> list[_Run]:
    """Every run of pairs whose equal stored bytes would settle them all as identical, in order:
    small records (RUN_RECORD_MAX_BYTES) of pairs alike (`_whole_and_alike`) whose bytes follow
    one another in contiguous packs on both sides, as a writer lays out a step's records, cut
    where their bytes pass a multiple of a stretch (STRETCH_BYTES) from the first; fewer than
    two such pairs are no run. Found on arrays before any is checked, so that their bytes are
    checked ahead of the comparison (`ByteChecks.ahead`). A real run's 220,000 small pairs took
    11 us each through their own checks and reads, and a search pair by pair 1 us each."""
    native, oracle = reader.native.capture, reader.oracle.capture
    n_fd, o_fd = native.descriptor, oracle.descriptor
    if n_fd is None or o_fd is None or len(pairs) < 2:
        return []
    n_seqs, o_seqs = seqs
    n_at, o_at = native.packed_addresses[n_seqs], oracle.packed_addresses[o_seqs]
    size = native.columns["nbytes"][n_seqs]
    usable = pairs.per_kind(_whole_and_alike, bool) if isinstance(pairs, AlignedPairs) else np.fromiter(map(_whole_and_alike, pairs), bool, len(pairs))
    usable &= (n_at >= 0) & (o_at >= 0) & (size <= RUN_RECORD_MAX_BYTES) & (size == oracle.columns["nbytes"][o_seqs])
    follows = np.zeros(len(pairs), dtype=bool)
    follows[1:] = usable[1:] & usable[:-1] & (n_at[1:] == n_at[:-1] + size[:-1]) & (o_at[1:] == o_at[:-1] + size[:-1])
    stretch = np.cumsum(~follows) - 1
    cut = (n_at - n_at[np.flatnonzero(~follows)][stretch]) // STRETCH_BYTES
    first = np.flatnonzero(~follows | np.concatenate(([True], cut[1:] != cut[:-1])))
    count = np.diff(np.append(first, len(pairs)))
    keep = usable[first] & (count >= 2)
    first, count = first[keep], count[keep]
    last = first + count - 1
    spans = n_at[last] + size[last] - n_at[first]
    return [
        _Run(start, n, ((n_fd, n_start), (o_fd, o_start), nbytes))
        for start, n, n_start, o_start, nbytes in zip(first.tolist(), count.tolist(), n_at[first].tolist(), o_at[first].tolist(), spans.tolist())
    ]


MetricsKind = tuple[str, tuple[int, ...]]
"""(logical dtype, compared shape): identical pairs of one kind have equal metrics."""


def _compared(pair: AlignedPair) -> MetricsKind:
    """What a pair's metrics describe: its dtype and the shape compared (a quantized record's
    blocks are compared as a flat run of its stored bytes)."""
    logical = pair.native.record.dtype
    ggml_type = logical_dtype(logical).ggml_type
    return logical, pair.native.shape if ggml_type is None else (quantized_nbytes(ggml_type, pair.native.record.shape),)


def _identical_metrics(kind: MetricsKind, identical: dict[MetricsKind, TensorMetrics]) -> TensorMetrics:
    """The metrics of an identical pair, one object per kind (`identical`), shared by all such
    pairs (finished metrics are never changed): a real run's document writes each once."""
    template = identical.get(kind)
    if template is None:
        template = identical[kind] = TensorMetrics.identical(*kind)
    return template


StoredBytes = tuple[np.ndarray, np.ndarray]
"""A pair's stored bytes, native and oracle, as one check read them (valid until the reader's next check)."""


def _stored_bytes_identical(pair: AlignedPair, reader: PairReader) -> tuple[bool, StoredBytes | None]:
    """Whether a pair is provably bit-exact from its stored bytes alone: both sides whole records
    of one dtype, shape and layout transform, each one contiguous run of its file, with equal
    bytes. A real model's run is hundreds of thousands of such small, mostly identical records;
    checking their bytes skips the reader and the diff engine's set-up, which cost ten times
    more than the bytes. A large identical record is settled at memcmp speed instead of going
    through the diff engine (a 4 GiB pair reports in 2.0-2.2x `cat`; 3.4x at 2 GiB before).
    Anything else (a short read, the first differing piece) goes the full way, which also
    reports what is wrong. Second: both sides' bytes when they differ and were read whole."""
    native, oracle = pair.native, pair.oracle
    if not _whole_and_alike(pair):
        return False, None
    spans = []
    for side, mapped in ((reader.native, native), (reader.oracle, oracle)):
        span, descriptor = stored_span(side.capture, mapped.record), side.capture.descriptor
        if span is None or descriptor is None:
            return False, None
        spans.append((descriptor, span))
    (n_fd, (n_at, n_bytes)), (o_fd, (o_at, o_bytes)) = spans
    if n_bytes != o_bytes:
        return False, None
    if reader.stored_bytes_equal((n_fd, n_at), (o_fd, o_at), n_bytes):
        return True, None
    return False, reader.held_bytes(n_bytes)


def _whole_pair(reader: PairReader, held: StoredBytes | None) -> tuple[np.ndarray, np.ndarray]:
    """Both sides of the pair in use, whole and canonical: from the bytes its check read when it has them."""
    if held is not None:
        native, oracle = reader.native.whole_from(held[0]), reader.oracle.whole_from(held[1])
        if native is not None and oracle is not None:
            return native, oracle
    return reader.native.whole(), reader.oracle.whole()


def _compare_pair(
    pair: AlignedPair,
    reader: PairReader,
    options: CompareOptions,
    heads: Heads,
    logit_rows: _LogitRows | None,
    progress: tuple[int, int],
    identical: dict[MetricsKind, TensorMetrics],
    last_read: tuple[bool, bool],
) -> ProgressGenerator[TensorMetrics]:
    """One pair through a DiffAccumulator, chunk by chunk; `progress` is (bytes done before it, total).
    `identical`: the shared metrics of identical pairs (`_identical_metrics`). `last_read`: whether
    no later pair reads its native, its oracle record (`pair_reader.last_reads`)."""
    logical, shape = kind = _compared(pair)
    template = _identical_metrics(kind, identical)
    identical, held = _stored_bytes_identical(pair, reader)
    if identical:
        yield Progress(progress[0] + pair_bytes(pair), progress[1], pair.key.label())
        return template
    ranges = chunk_rows(pair, options.chunk_bytes)
    rows_axis, head_split = _axes(pair, heads)
    reader.use(pair)

    def reread_oracle(start: int, stop: int) -> np.ndarray:
        return reader.oracle.rows((start, stop))

    accumulator = DiffAccumulator(
        logical, shape, options.tolerance_for(pair.key, logical), rows_axis, head_split, reread_oracle if ranges is not None else None
    )
    label = pair.key.label()
    if ranges is None:
        n_bits, o_bits = _whole_pair(reader, held)
        accumulator.add(n_bits, o_bits, 0)
        if logit_rows is not None and n_bits.ndim == 2:
            logit_rows.keep(n_bits, o_bits, (0, n_bits.shape[0]), n_bits.shape[0])
    else:
        done = progress[0]
        for rows in ranges:
            n_bits, o_bits = reader.native.rows(rows), reader.oracle.rows(rows)
            accumulator.add(n_bits, o_bits, rows[0])
            if logit_rows is not None:
                logit_rows.keep(n_bits, o_bits, rows, pair.native.shape[0])
            done += n_bits.nbytes + o_bits.nbytes
            yield Progress(done, progress[1], label)
    yield Progress(progress[0] + pair_bytes(pair), progress[1], label)
    finished = accumulator.finish()  # (which may read the oracle's rows again)
    reader.done_with(pair, last_read)
    return template if finished.bit_exact and finished == template else finished


def iter_compare_pairs(
    reader: PairReader,
    pairs: list[AlignedPair],
    options: CompareOptions,
    heads: Heads,
    progress: tuple[int, int],
    after_pair: Callable[[int], None] | None = None,
) -> ProgressGenerator[list[PairOutcome]]:
    """Compare `pairs` in order; `progress` is (bytes done before them, total), `after_pair(i)` is
    told when pair i is done (the read-ahead moves on). Runs of small records are settled at
    once where their bytes are equal (`_runs`), checked ahead on the reader's threads; a run that
    differs goes pair by pair."""
    outcomes: list[PairOutcome] = []
    identical: dict[MetricsKind, TensorMetrics] = {}
    settled_as: dict[tuple[str, tuple[int, ...], tuple[int, ...]], tuple[PairOutcome, int]] = {}
    """A settled pair's outcome and bytes by (dtype, compared shape, stored shape): a run's pairs are
    a few kinds, and one look-up each cost a fifth of working both out (a real run: 220,000 pairs)."""
    done = shown = progress[0]
    seqs = record_seqs(pairs)
    by_kind: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    """For `AlignedPairs`: (a pair of each kind, each pair's kind, each pair's bytes), so a settled run's
    outcomes are taken per kind without building its pairs."""
    if isinstance(pairs, AlignedPairs):
        by_kind = (*pairs.first_of_kinds(), pair_byte_counts(pairs))
    kind_outcomes: dict[int, PairOutcome] = {}
    runs = _runs(pairs, reader, seqs)
    reads = [(True, True)] * len(pairs) if reader.checks.keeps_all else last_reads(seqs)  # only a pair larger than memory lets bytes go
    equal = reader.checks.ahead([run.check for run in runs])
    next_run = iter(runs)
    run = next(next_run, None)
    index = 0
    try:
        while index < len(pairs):
            if run is not None and index == run.start:
                settled = next(equal)
                if settled and by_kind is not None:
                    first_of, kind_of, sizes = by_kind
                    for code in kind_of[index : index + run.count].tolist():
                        found_outcome = kind_outcomes.get(code)
                        if found_outcome is None:
                            found_outcome = kind_outcomes[code] = (_identical_metrics(_compared(pairs[int(first_of[code])]), identical), None)
                        outcomes.append(found_outcome)
                    done += int(sizes[index : index + run.count].sum())
                elif settled:
                    for pair in pairs[index : index + run.count]:
                        kind = (pair.native.record.dtype, pair.native.shape, pair.native.record.shape)
                        found = settled_as.get(kind)
                        if found is None:
                            found = settled_as[kind] = ((_identical_metrics(_compared(pair), identical), None), pair_bytes(pair))
                        outcomes.append(found[0])
                        done += found[1]
                if settled:
                    index += run.count
                    if done - shown >= PROGRESS_BYTES or index == len(pairs):
                        # Not a step per run: a real run's short runs (its unaligned records cut
                        # them) were 20,000 steps through every caller's generator.
                        last_key = pairs.key_at(index - 1) if isinstance(pairs, AlignedPairs) else pairs[index - 1].key
                        yield Progress(done, progress[1], last_key.label())
                        shown = done
                    if after_pair is not None:
                        after_pair(index - 1)
                    run = next(next_run, None)
                    continue
                run = next(next_run, None)  # the run's bytes differ somewhere: each pair says where
            pair = pairs[index]
            logit_rows = _LogitRows() if pair.key.op == "logits" else None
            metrics = yield from _compare_pair(pair, reader, options, heads, logit_rows, (done, progress[1]), identical, reads[index])
            done += pair_bytes(pair)
            agreement = None
            if logit_rows is not None and logit_rows.native is not None and logit_rows.oracle is not None:
                agreement = logit_agreement(logit_rows.native, logit_rows.oracle, pair.native.record.dtype, options.top_k)
            outcomes.append((metrics, agreement))
            if after_pair is not None:
                after_pair(index)
            index += 1
    finally:
        equal.close()
    return outcomes
