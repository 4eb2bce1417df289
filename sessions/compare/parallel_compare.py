"""Comparing a pair of captures on every core: worker processes, each reading its own records.

One process compares at about the speed it can decode and diff bytes, not at the speed the disk
delivers them; users run this on 10-24-core machines. The aligned pairs are cut into shards of
consecutive pairs (a few times more shards than workers, so a slow shard does not hold the
others), each worker opens both captures once (the first-open check is cached) and compares
its shards with the same per-pair code and bounded buffers as a one-process comparison, and
the results come back in execution order. Closing the generator terminates the workers.

Workers start with `spawn`: the comparison's process may hold threads (read-ahead) and open HDF5
handles, neither of which survives a fork safely.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from multiprocessing.pool import AsyncResult, Pool
from pathlib import Path

from sessions.capture.opening import open_capture
from sessions.capture.reader import Capture
from sessions.compare.align import AlignedPair
from sessions.compare.options import CompareOptions
from sessions.compare.pair_compare import Heads, PairOutcome, iter_compare_pairs
from sessions.compare.pair_reader import PairReader, pair_bytes
from sessions.progress import Progress, ProgressGenerator, run_to_end

PARALLEL_MIN_BYTES = 2 * 1024**3
"""Below this many bytes (both sides), starting workers (about 0.3 s each, plus opening both
captures) costs more than it saves: one process compares a warm bf16 pair at about 3.5 GB/s
(benchmarks/bench_report.py, 2.15 GB: 0.61 s in one process, 0.97 s on two workers of 2 cores)."""
MIN_AUTO_CORES = 4
"""With fewer cores the one process, its read-ahead thread and the page cache already fill them."""
MAX_AUTO_WORKERS = 16
SHARDS_PER_WORKER = 4
POLL_SECONDS = 0.1
PR_SET_PDEATHSIG = 1

_open: dict[str, Capture] = {}
"""A worker's open captures, by path: opened once for all its shards."""


def worker_count(options: CompareOptions, total_bytes: int) -> int:
    """How many processes compare: as asked, else one per core for a large comparison."""
    if options.workers > 0:
        return options.workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if total_bytes < PARALLEL_MIN_BYTES or cores < MIN_AUTO_CORES:
        return 1
    return min(MAX_AUTO_WORKERS, cores)


def shards(pairs: list[AlignedPair], parts: int) -> list[range]:
    """Consecutive runs of pairs of about equal bytes, in order."""
    total = sum(pair_bytes(p) for p in pairs) or 1
    target = total / max(1, parts)
    out: list[range] = []
    start, held = 0, 0
    for index, pair in enumerate(pairs):
        held += pair_bytes(pair)
        if held >= target and index + 1 < len(pairs):
            out.append(range(start, index + 1))
            start, held = index + 1, 0
    if start < len(pairs):
        out.append(range(start, len(pairs)))
    return out


def _die_with_parent() -> None:
    """A worker's first act: when the comparing process is killed (the viewer's cancel kills its
    comparison child), its workers die too instead of finishing their shards unseen (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _capture(path: str) -> Capture:
    if path not in _open:
        _open[path] = open_capture(Path(path))
    return _open[path]


def _compare_shard(native: str, oracle: str, pairs: list[AlignedPair], options: CompareOptions, heads: Heads) -> list[PairOutcome]:
    """In a worker: one shard's outcomes."""
    reader = PairReader(_capture(native), _capture(oracle))
    return run_to_end(iter_compare_pairs(reader, pairs, options, heads, (0, 1)))


def iter_compare_in_workers(
    native: Capture, oracle: Capture, pairs: list[AlignedPair], options: CompareOptions, heads: Heads, workers: int, total: int
) -> ProgressGenerator[list[PairOutcome]]:
    """Every pair's outcome, in order, compared by `workers` processes; yields Progress(bytes, total)."""
    parts = shards(pairs, workers * SHARDS_PER_WORKER)
    pool: Pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_die_with_parent)
    try:
        pending: list[tuple[range, AsyncResult[list[PairOutcome]]]] = [
            (part, pool.apply_async(_compare_shard, (str(native.path), str(oracle.path), [pairs[i] for i in part], options, heads)))
            for part in parts
        ]
        sizes = [sum(pair_bytes(pairs[i]) for i in part) for part in parts]
        while True:
            ready = [result.ready() for _, result in pending]
            yield Progress(sum(size for size, r in zip(sizes, ready) if r), total, f"comparing on {workers} processes")
            if all(ready):
                break
            next(result for (_, result), r in zip(pending, ready) if not r).wait(POLL_SECONDS)
        pool.close()
        return [outcome for _, result in pending for outcome in result.get()]
    finally:
        pool.terminate()
        pool.join()
