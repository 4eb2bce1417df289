"""Comparing a pair of captures on every core: this process and worker processes, each reading its own records.

One process compares at about the speed it can decode and diff bytes, not at the speed the disk
delivers them: a bit-identical warm pair streams at about the speed of copying it from the page
cache, but a pair whose elements differ is decoded element by element, orders of magnitude
slower; users run this on 10-24-core machines. The aligned pairs are cut into shards of
consecutive pairs (a few times more shards than processes, so a slow shard does not hold the
others). This process compares shards from the front, in the order a one-process comparison
reads them (with its read-ahead), and starts workers only once, at its rate over the last RECENT_S, the
rest would take it longer than SPAWN_WHEN_LEFT_S and twice the cost of shipping the workers the
rest's pairs (SHIP_S_PER_PAIR: a real run's 220,000 small pairs cost more to ship than to
compare here): a worker costs about 0.3 s before it compares
anything (an interpreter, numpy, h5py, opening both captures; the first-open check is cached),
which on a busy 2-core machine doubled a warm 1 GB report that one process finishes in half a
second. Workers take the remaining shards from the back; a shard is compared by whoever claims
it first (a flag per shard, shared by all processes), with the same per-pair code and bounded
buffers as a one-process comparison, and the results come back in execution order. Closing the
generator terminates the workers.

Workers start with `spawn`: the comparison's process may hold threads (read-ahead) and open HDF5
handles, neither of which survives a fork safely.
"""

from __future__ import annotations

import math
import pickle
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sessions.capture.opening import open_capture
from sessions.capture.reader import Capture, CaptureError
from sessions.child_process import die_with_parent
from sessions.compare.aligned_pairs import AlignedPair
from sessions.compare.byte_checks import ByteChecks
from sessions.compare.heap_tuning import keep_temporaries_on_heap
from sessions.compare.key import OpKey
from sessions.compare.layout_transform import LayoutTransform
from sessions.compare.mapped_record import BatchRow, MappedRecord, batch_of
from sessions.compare.options import CompareOptions
from sessions.compare.pair_compare import Heads, PairOutcome, iter_compare_pairs
from sessions.compare.pair_reader import PairReader
from sessions.gc_pause import garbage_collection_paused
from sessions.machine import usable_cores
from sessions.progress import Progress, ProgressGenerator, run_to_end

if TYPE_CHECKING:
    from multiprocessing.pool import AsyncResult, Pool
    from multiprocessing.sharedctypes import SynchronizedArray

MIN_CORES_BEHIND_A_WINDOW = 4
"""Below this many cores, a comparison behind a window (the viewer's comparison child) compares
in one process unless asked otherwise: with two processes on 2 cores the window stalled for 103
and 132 ms in two of three runs of `bench_ui_stall --records 240000 --diverged`; with one, its
longest gap while the child compared was 28 ms (89.8 ms over the whole run, at Ctrl+J).
Headless, every core pays for a pair whose elements differ, whose diff engine holds one core
per process: on 2 cores two processes reported a 24,000-record pair of which 9,600 records
diverged in 3.2 s against 4.2-4.7 s, and a 1.07 GB pair of diverged 4096x4096 tensors in
3.0-3.2 s against 4.9-5.0 s. A pair that stays identical starts no workers (its rate decides)."""
MAX_AUTO_WORKERS = 16
SHARDS_PER_WORKER = 16
"""Shards are claimed whole, so the last one a process takes can leave the others idle: a
diverged run's differing pairs, all at its end and a hundred times slower than identical ones,
left one of two processes alone for a quarter of the comparison with 4 shards per worker."""
SPAWN_WHEN_LEFT_S = 1.0
"""Workers start once this process, at the rate it has compared so far, would need longer than
this (plus twice what shipping the pairs costs) for the rest: about twice what a worker takes
to start on a busy machine."""
SHIP_S_PER_PAIR = 16e-6
"""What a pair costs to reach the workers: made a row and pickled here (3.2 us), unpickled (0.6 us)
and built again from a worker's own captures, its records included (12 us), before the worker
compares it. Counted in the decision to start workers, so a capture of many small identical
records is not made slower by them (they compare at 2 us a pair here). Pairs shipped with their
records cost 31 us (on 2 cores, 21 s with a worker against 10 s without)."""
MEASURE_S = 0.1
"""How long this process compares before its rate is trusted (its first reads pay for its buffers)."""
RECENT_S = 0.5
"""The rate that decides is this process's over about the last half second, not since it began:
a run is fast while it is identical and slow from its first divergence on, and an average over
the fast part started the workers four seconds into the slow one."""
POLL_SECONDS = 0.1

_open: dict[str, Capture] = {}
"""A worker's open captures, by path: opened once for all its shards."""
_claims: SynchronizedArray[int] | None = None
"""A worker's view of the shared flags: shard i is taken once flag i is set."""
_job: _Job | None = None
"""A worker's comparison: given once when it starts, so a task is only a shard's number."""


ShippedSide = tuple[int, tuple[Any, ...], tuple[int, ...], str | None, tuple[int, int] | None]
"""One side of a pair as the workers get it: (seq, key fields, canonical shape, layout spec, window)."""
ShippedPair = tuple[ShippedSide, ShippedSide, str | None]
"""A pair as a row of plain values (native side, oracle side, manual reason): each worker builds
the pair again from its own open captures. Pickled pairs with their records took 31 us each to
ship (3.3 s per worker for a real run's 220,000); a row takes a tenth."""


@dataclass(frozen=True)
class _Job:
    native: str
    oracle: str
    shards: dict[int, list[ShippedPair]]
    """The pairs of each shard not yet taken when the workers started, by shard number."""
    options: CompareOptions
    heads: Heads


def _shipped_side(mapped: MappedRecord) -> ShippedSide:
    return mapped.record.seq, tuple(mapped.key), mapped.shape, mapped.layout.spec if mapped.layout is not None else None, mapped.window


def shipped(pair: AlignedPair) -> ShippedPair:
    """`pair` as the workers get it (ShippedPair); `rebuilt` is its inverse."""
    return _shipped_side(pair.native), _shipped_side(pair.oracle), pair.manual_reason


def rebuilt(rows: list[ShippedPair], native: Capture, oracle: Capture) -> list[AlignedPair]:
    """The pairs `shipped` made `rows` of, their records from these open captures."""
    sides = (native, batch_of(native)), (oracle, batch_of(oracle))
    pairs = []
    for row in rows:
        n, o = (_rebuilt_side(side, capture, batch) for side, (capture, batch) in zip(row, sides))
        pairs.append(AlignedPair(n.key, n, o, row[2]))
    return pairs


def _rebuilt_side(side: ShippedSide, capture: Capture, batch: BatchRow | None) -> MappedRecord:
    seq, key, shape, spec, window = side
    record = capture.record(seq)
    if record is None:
        raise CaptureError(capture.path, f"index row {seq}", "is gone: the capture changed while it was compared")
    return MappedRecord(record, OpKey(*key), _layout(spec), shape, window, batch)


@cache
def _layout(spec: str | None) -> LayoutTransform | None:
    return None if spec is None else LayoutTransform.parse(spec)


_behind_a_window = False
"""Whether this process compares for a window waiting on it (`leave_the_window_a_core`)."""


def leave_the_window_a_core() -> None:
    """Said once by a process that compares behind a window, before it compares: below
    MIN_CORES_BEHIND_A_WINDOW cores it then starts no workers unless asked. The process exists
    for that one comparison (`sessions.compare.in_child --behind-a-window`), so this holds for
    its whole life, as its lower priority does."""
    global _behind_a_window
    _behind_a_window = True


def worker_count(options: CompareOptions) -> int:
    """How many processes may compare: as asked, else one per core (`MIN_CORES_BEHIND_A_WINDOW`:
    one below 4 cores behind a window). Not by size: a pair's bytes do not say how long it takes
    (a differing pair is decoded element by element, orders of magnitude slower than an
    identical one streams), and workers start only once this process, at the rate it is going,
    would need longer than SPAWN_WHEN_LEFT_S for the rest."""
    if options.workers > 0:
        return options.workers
    cores = usable_cores()
    if _behind_a_window and cores < MIN_CORES_BEHIND_A_WINDOW:
        return 1
    return min(MAX_AUTO_WORKERS, cores)


def check_threads(options: CompareOptions) -> int:
    """How many threads of the comparing process may check stored bytes at once
    (sessions.compare.byte_checks): as many as processes were asked for, else one per core.
    Unlike workers, threads pay on 2 cores too: they cost no start and share the process's memory."""
    return options.workers if options.workers > 0 else min(MAX_AUTO_WORKERS, usable_cores())


def shards(sizes: np.ndarray, parts: int) -> list[range]:
    """Consecutive runs of pairs (of `sizes`: `pair_byte_counts`) of about equal bytes, in order."""
    target = (int(sizes.sum()) or 1) / max(1, parts)
    out: list[range] = []
    start, held = 0, 0
    for index, size in enumerate(sizes.tolist()):
        held += size
        if held >= target and index + 1 < len(sizes):
            out.append(range(start, index + 1))
            start, held = index + 1, 0
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out


def _claim(claims: SynchronizedArray[int], index: int) -> bool:
    """Take shard `index` unless another process has; exactly one claim of each shard succeeds."""
    with claims.get_lock():
        if claims[index]:
            return False
        claims[index] = 1
        return True


def _start_worker(claims: SynchronizedArray[int], job: bytes) -> None:
    """A worker's first act: it keeps the claims every process shares and the comparison, and dies
    with the comparing process, so that when that one is killed (the viewer's cancel kills its
    comparison child) its workers do not finish their shards unseen (Linux).

    The pairs come here, with the worker's start, not with each task: a task carrying a shard's
    pairs could fill the pool's pipe, and a pool closed while its feeder thread blocks on that
    pipe never finishes closing (a comparison cancelled just after its workers started hung).
    They come pickled once for all workers: each worker's start arguments are pickled on their
    own, and a real run's pairs take seconds to pickle."""
    global _claims, _job
    keep_temporaries_on_heap()
    _claims, _job = claims, pickle.loads(job)
    die_with_parent()


def _capture(path: str) -> Capture:
    if path not in _open:
        _open[path] = open_capture(Path(path))
    return _open[path]


def _compare_shard(index: int) -> list[PairOutcome] | None:
    """In a worker: one shard's outcomes, or None when the comparing process took the shard."""
    assert _claims is not None and _job is not None
    if not _claim(_claims, index):
        return None
    job = _job
    native, oracle = _capture(job.native), _capture(job.oracle)
    with garbage_collection_paused():
        pairs = rebuilt(job.shards[index], native, oracle)
        with PairReader(native, oracle) as reader:  # closed: its checks let go of the bytes they still hold (page_release)
            return run_to_end(iter_compare_pairs(reader, pairs, job.options, job.heads, (0, 1)))


class _Workers:
    """The shards' claims and, once started, the workers and their pending shards.

    Until workers start only this process claims shards, so a plain bytearray holds the claims;
    the array the workers share starts as a copy of it."""

    def __init__(self, parts: list[range]) -> None:
        self.parts = parts
        self._taken = bytearray(len(parts))
        self._shared: SynchronizedArray[int] | None = None
        self.pool: Pool | None = None
        self.pending: dict[int, AsyncResult[list[PairOutcome] | None]] = {}
        self._ready: dict[int, int] = {}
        """Bytes a worker compared, by shard whose result is ready (0: this process took it)."""

    def claim(self, index: int) -> bool:
        if self._shared is not None:
            return _claim(self._shared, index)
        if self._taken[index]:
            return False
        self._taken[index] = 1
        return True

    def start(self, count: int, native: Capture, oracle: Capture, pairs: list[AlignedPair], options: CompareOptions, heads: Heads) -> None:
        """Start `count` workers on the shards not taken yet, the last shard first."""
        import multiprocessing  # only a comparison that starts workers pays for loading it

        context = multiprocessing.get_context("spawn")
        self._shared = context.Array("b", list(self._taken))
        left = self.left()
        job = _Job(str(native.path), str(oracle.path), {i: [shipped(pairs[p]) for p in self.parts[i]] for i in left}, options, heads)
        pickled = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        self.pool = context.Pool(count, initializer=_start_worker, initargs=(self._shared, pickled))
        for index in reversed(left):
            self.pending[index] = self.pool.apply_async(_compare_shard, (index,))

    def left(self) -> list[int]:
        """The shards no process has taken yet (before the workers start)."""
        return [index for index in range(len(self.parts)) if not self._taken[index]]

    def done(self, sizes: list[int]) -> int:
        """Bytes of the shards workers have finished: not those a worker gave up because this
        process had claimed them (counted as this process compares them). Asked at every pair
        this process compares, so each shard's result is looked at until it is ready, not after."""
        for i in [i for i, result in self.pending.items() if i not in self._ready and result.ready()]:
            result = self.pending[i]
            self._ready[i] = sizes[i] if result.successful() and result.get() is not None else 0
        return sum(self._ready.values())

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


class _RecentRate:
    """Bytes per second over about the last RECENT_S, from samples of (time, bytes done)."""

    def __init__(self, started: float) -> None:
        self._samples: deque[tuple[float, int]] = deque([(started, 0)])

    def seconds_left(self, now: float, done: int, total: int) -> float:
        """How long the rest would take at the recent rate (no progress in the window: forever)."""
        while len(self._samples) > 1 and now - self._samples[1][0] >= RECENT_S:
            self._samples.popleft()
        since, done_then = self._samples[0]
        if now - self._samples[-1][0] >= RECENT_S / 10:
            self._samples.append((now, done))
        if done <= done_then:
            return math.inf
        return (total - done) * (now - since) / (done - done_then)


def _worth_starting_after(others: _Workers, first_left: int) -> float:
    """Seconds this process must still have ahead of it for workers to pay: their start, and
    shipping them the pairs of the shards after the one it is comparing (none left: never)."""
    shipped = sum(len(part) for part in others.parts[first_left:])
    return SPAWN_WHEN_LEFT_S + 2 * SHIP_S_PER_PAIR * shipped if shipped else math.inf


def iter_compare_in_workers(
    native: Capture,
    oracle: Capture,
    pairs: list[AlignedPair],
    options: CompareOptions,
    heads: Heads,
    workers: int,
    pair_sizes: np.ndarray,
    checks: ByteChecks,
    after_pair: Callable[[int], None] | None = None,
) -> ProgressGenerator[list[PairOutcome]]:
    """Every pair's outcome, in order, compared by this process (its stored bytes checked by
    `checks`) and, when the comparison is slow enough to pay for them, `workers - 1` others;
    yields Progress(bytes, total of `pair_sizes`, the pairs' `pair_byte_counts`). `after_pair(i)`
    is told when this process is done with pair i (the read-ahead moves on)."""
    total = int(pair_sizes.sum()) or 1
    parts = shards(pair_sizes, workers * SHARDS_PER_WORKER)
    sizes = [int(pair_sizes[part.start : part.stop].sum()) for part in parts]
    others = _Workers(parts)
    own: dict[int, list[PairOutcome]] = {}
    reader = PairReader(native, oracle, checks)
    started = time.monotonic()
    rate = _RecentRate(started)
    try:
        for index, part in enumerate(parts):
            if not others.claim(index):
                break
            mine = sum(sizes[i] for i in own)

            def done_with(i: int, first: int = part.start) -> None:
                if after_pair is not None:
                    after_pair(first + i)

            work = iter_compare_pairs(reader, pairs[part.start : part.stop], options, heads, (mine, total), done_with)
            while True:
                try:
                    step = next(work)
                except StopIteration as stop:
                    own[index] = stop.value
                    break
                if others.pool is None:
                    now = time.monotonic()
                    left = rate.seconds_left(now, step.done, total)
                    if now - started >= MEASURE_S and step.done and left > _worth_starting_after(others, index + 1):
                        others.start(workers - 1, native, oracle, pairs, options, heads)
                if others.pool is None:
                    yield step
                else:
                    yield Progress(step.done + others.done(sizes), total, f"comparing on {workers} processes")
        while others.pool is not None:
            waiting = [result for i, result in others.pending.items() if i not in own and not result.ready()]
            yield Progress(sum(sizes[i] for i in own) + others.done(sizes), total, f"comparing on {workers} processes")
            if not waiting:
                others.pool.close()
                break
            waiting[0].wait(POLL_SECONDS)
        outcomes: list[PairOutcome] = []
        for index in range(len(parts)):
            shard = own[index] if index in own else others.pending[index].get()
            assert shard is not None, "a shard this process did not take was compared by a worker"
            outcomes += shard
        return outcomes
    finally:
        reader.close()
        others.close()
