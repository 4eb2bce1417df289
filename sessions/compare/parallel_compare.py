"""Comparing a pair of captures on every core: this process and worker processes, each reading its own records.

One process compares at about the speed it can decode and diff bytes, not at the speed the disk
delivers them; users run this on 10-24-core machines. The aligned pairs are cut into shards of
consecutive pairs (a few times more shards than processes, so a slow shard does not hold the
others). Every shard is queued for the workers, front first, and the comparing process itself
takes shards from the back while the workers start: a worker costs about 0.3 s before it
compares anything (an interpreter, numpy, h5py, opening both captures; the first-open check is
cached), and a comparison that ends before they are up has paid only for starting them. A shard
is compared by whoever claims it first (a flag per shard, shared by all processes), with the same
per-pair code and bounded buffers as a one-process comparison; the results come back in
execution order. Closing the generator terminates the workers.

Workers start with `spawn`: the comparison's process may hold threads (read-ahead) and open HDF5
handles, neither of which survives a fork safely.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sessions.capture.opening import open_capture
from sessions.capture.reader import Capture
from sessions.compare.align import AlignedPair
from sessions.compare.options import CompareOptions
from sessions.compare.pair_compare import Heads, PairOutcome, iter_compare_pairs
from sessions.compare.pair_reader import PairReader, pair_bytes
from sessions.progress import Progress, ProgressGenerator, run_to_end

if TYPE_CHECKING:
    from multiprocessing.pool import AsyncResult
    from multiprocessing.sharedctypes import SynchronizedArray

PARALLEL_MIN_BYTES = 2 * 1024**3
"""Below this many bytes (both sides), starting workers (about 0.3 s each, plus opening both
captures) costs more than it saves: one process compares a warm bit-identical bf16 pair at about
5 GB/s, close to what copying it from the page cache costs (benchmarks/bench_report.py)."""
MIN_AUTO_CORES = 4
"""With fewer cores the one process, its read-ahead thread and the page cache already fill them."""
MAX_AUTO_WORKERS = 16
SHARDS_PER_WORKER = 4
POLL_SECONDS = 0.1
PR_SET_PDEATHSIG = 1

_open: dict[str, Capture] = {}
"""A worker's open captures, by path: opened once for all its shards."""
_claims: SynchronizedArray[int] | None = None
"""A worker's view of the shared flags: shard i is taken once flag i is set."""


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


def _claim(claims: SynchronizedArray[int], index: int) -> bool:
    """Take shard `index` unless another process has; exactly one claim of each shard succeeds."""
    with claims.get_lock():
        if claims[index]:
            return False
        claims[index] = 1
        return True


def _start_worker(claims: SynchronizedArray[int]) -> None:
    """A worker's first act: when the comparing process is killed (the viewer's cancel kills its
    comparison child), its workers die too instead of finishing their shards unseen (Linux)."""
    global _claims
    _claims = claims
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _capture(path: str) -> Capture:
    if path not in _open:
        _open[path] = open_capture(Path(path))
    return _open[path]


def _compare_shard(
    index: int, native: str, oracle: str, pairs: list[AlignedPair], options: CompareOptions, heads: Heads
) -> list[PairOutcome] | None:
    """In a worker: one shard's outcomes, or None when the comparing process took the shard."""
    assert _claims is not None
    if not _claim(_claims, index):
        return None
    reader = PairReader(_capture(native), _capture(oracle))
    return run_to_end(iter_compare_pairs(reader, pairs, options, heads, (0, 1)))


def iter_compare_in_workers(
    native: Capture, oracle: Capture, pairs: list[AlignedPair], options: CompareOptions, heads: Heads, workers: int, total: int
) -> ProgressGenerator[list[PairOutcome]]:
    """Every pair's outcome, in order, compared by this process and `workers - 1` others; yields
    Progress(bytes, total)."""
    import multiprocessing  # only a parallel comparison pays for loading it

    label = f"comparing on {workers} processes"
    parts = shards(pairs, workers * SHARDS_PER_WORKER)
    sizes = [sum(pair_bytes(pairs[i]) for i in part) for part in parts]
    context = multiprocessing.get_context("spawn")
    claims = context.Array("b", len(parts))
    pool = context.Pool(workers - 1, initializer=_start_worker, initargs=(claims,))
    try:
        pending: list[AsyncResult[list[PairOutcome] | None]] = [
            pool.apply_async(_compare_shard, (index, str(native.path), str(oracle.path), [pairs[i] for i in part], options, heads))
            for index, part in enumerate(parts)
        ]
        yield Progress(0, total, label)
        own: dict[int, list[PairOutcome]] = {}
        reader = PairReader(native, oracle)

        def done_elsewhere() -> int:
            return sum(size for index, (size, result) in enumerate(zip(sizes, pending)) if index not in own and result.ready())

        for index in reversed(range(len(parts))):
            if not _claim(claims, index):
                break
            mine = sum(sizes[i] for i in own)
            work = iter_compare_pairs(reader, [pairs[i] for i in parts[index]], options, heads, (mine, total))
            while True:
                try:
                    step = next(work)
                except StopIteration as stop:
                    own[index] = stop.value
                    break
                yield Progress(step.done + done_elsewhere(), total, label)
        while True:
            waiting = [result for index, result in enumerate(pending) if index not in own and not result.ready()]
            yield Progress(sum(sizes[i] for i in own) + done_elsewhere(), total, label)
            if not waiting:
                break
            waiting[0].wait(POLL_SECONDS)
        pool.close()
        outcomes: list[PairOutcome] = []
        for index, result in enumerate(pending):
            shard = own[index] if index in own else result.get()
            assert shard is not None, "a shard nobody else claimed was compared by a worker"
            outcomes += shard
        return outcomes
    finally:
        pool.terminate()
        pool.join()
