"""A comparison split over worker processes says exactly what the one-process comparison says."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessions.capture.opening import open_capture
from sessions.compare import parallel_compare
from sessions.compare.align import align
from sessions.compare.comparison import Comparison, iter_compare, resolve_profiles
from sessions.compare.document import dumps
from sessions.compare.options import CompareOptions
from sessions.compare.pair_reader import pair_byte_counts, pair_bytes
from sessions.compare.parallel_compare import (
    RECENT_S,
    _RecentRate,
    shards,
    worker_count,
)
from sessions.progress import Progress, run_to_end


def _rounded(value: object) -> object:
    """A document with floats to 9 significant digits: sums of squares come from BLAS, whose
    last bits depend on how a process splits the work; every count, bit and word must match."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


@pytest.fixture
def workers_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start the workers at the first chunk: the demo pairs take this process far less than the
    second that would otherwise make them worth starting."""
    monkeypatch.setattr(parallel_compare, "SPAWN_WHEN_LEFT_S", 0.0)
    monkeypatch.setattr(parallel_compare, "SHIP_S_PER_PAIR", 0.0)
    monkeypatch.setattr(parallel_compare, "MEASURE_S", 0.0)


def _steps_and_result(work: Iterator[Progress]) -> tuple[list[Progress], Comparison]:
    """Every progress step of a comparison, and the comparison it returns."""
    steps: list[Progress] = []
    while True:
        try:
            steps.append(next(work))
        except StopIteration as stop:
            return steps, stop.value


def _alone_and_on_workers(paths: tuple[Path, Path], workers: int) -> tuple[Comparison, Comparison, list[str]]:
    """The pair compared in one process, then allowing `workers` processes, and the labels of the latter's progress."""
    with open_capture(paths[0]) as n, open_capture(paths[1]) as o:
        alone = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
        steps, split = _steps_and_result(iter_compare(n, o, CompareOptions(workers=workers)))
    return alone, split, [step.label for step in steps]


def test_two_workers_give_the_same_document_as_one_process(
    demo_pairs: dict[str, tuple[Path, Path]], workers_at_once: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_claim = parallel_compare._Workers.claim
    # This process keeps the first shard; the workers compare all the others.
    monkeypatch.setattr(parallel_compare._Workers, "claim", lambda self, index: index == 0 and real_claim(self, index))
    alone, split, labels = _alone_and_on_workers(demo_pairs["swiglu-order"], 2)
    assert _rounded(json.loads(dumps(split))) == _rounded(json.loads(dumps(alone)))
    assert "comparing on 2 processes" in labels
    assert split.verdict.first is not None and split.verdict.first.key.text() == "0:text-before:0:ffn_act"


def test_closing_a_parallel_comparison_stops_its_workers(demo_pairs: dict[str, tuple[Path, Path]], workers_at_once: None) -> None:
    native, oracle = demo_pairs["clean"]
    with open_capture(native) as n, open_capture(oracle) as o:
        work = iter_compare(n, o, CompareOptions(workers=2))
        step = next(work)
        while "processes" not in step.label:
            step = next(work)
        assert isinstance(step, Progress)
        work.close()
    assert multiprocessing.active_children() == []


def test_shards_are_consecutive_runs_of_about_equal_bytes_and_workers_are_as_many_as_asked(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    native, oracle = demo_pairs["clean"]
    with open_capture(native) as n, open_capture(oracle) as o:
        pairs = align(n.records, o.records, *resolve_profiles(n, o, CompareOptions())).pairs
    parts = shards(pair_byte_counts(pairs), 8)
    assert [i for part in parts for i in part] == list(range(len(pairs)))
    sizes = [sum(pair_bytes(pairs[i]) for i in part) for part in parts]
    assert len(parts) == 8 and max(sizes) < 2 * sum(sizes) / 8
    assert worker_count(CompareOptions(workers=3)) == 3


class _IdleWorkers:
    """A pool whose workers never get to a shard (still starting, or every core busy)."""

    def __init__(self, processes: int, initializer: object = None, initargs: tuple[object, ...] = ()) -> None:
        self.processes = processes

    def apply_async(self, function: object, args: tuple[object, ...]) -> _IdleWorkers:
        return self

    def ready(self) -> bool:
        return False

    def wait(self, timeout: float) -> None:
        raise AssertionError("the comparing process waited for a worker that was never needed")

    def get(self) -> None:
        raise AssertionError("a worker's result was used for a shard the comparing process took")

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        pass

    def join(self) -> None:
        pass


@pytest.mark.parametrize(("cores", "headless", "behind_a_window"), [(1, 1, 1), (2, 2, 1), (3, 3, 1), (4, 4, 4), (40, 16, 16)])
def test_headless_a_comparison_may_use_every_core_and_behind_a_window_one_process_below_four(
    monkeypatch: pytest.MonkeyPatch, cores: int, headless: int, behind_a_window: int
) -> None:
    """On 2 cores two processes report a diverged pair 1.3-1.6x faster, so a CI runner's report
    uses both; a window on 2 or 3 cores keeps a core while its child compares. Asked, the count
    is what was asked, wherever."""
    monkeypatch.setattr(parallel_compare, "usable_cores", lambda: cores)
    assert worker_count(CompareOptions()) == headless
    assert worker_count(CompareOptions(workers=3)) == 3
    monkeypatch.setattr(parallel_compare, "_behind_a_window", False)
    parallel_compare.leave_the_window_a_core()
    assert worker_count(CompareOptions()) == behind_a_window
    assert worker_count(CompareOptions(workers=3)) == 3


WINDOW_CHILD_WORKERS = """
import sys
from sessions.compare import parallel_compare
from sessions.compare.in_child import main
from sessions.compare.options import CompareOptions

parallel_compare.usable_cores = lambda: 2
main(sys.argv[1:])
print(parallel_compare.worker_count(CompareOptions()), file=sys.stderr)
"""


@pytest.mark.parametrize(("flags", "workers"), [((), "2"), (("--behind-a-window",), "1")])
def test_the_comparison_child_leaves_a_core_only_when_a_window_waits_on_it(demo_pairs: dict[str, tuple[Path, Path]], flags: tuple[str, ...], workers: str) -> None:
    import subprocess
    import sys

    native, oracle = demo_pairs["clean"]
    run = subprocess.run(
        [sys.executable, "-c", WINDOW_CHILD_WORKERS, *flags, str(native), str(oracle)],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "result" in run.stdout.splitlines() and run.stderr.splitlines()[-1] == workers


def test_the_comparing_process_takes_every_shard_no_worker_gets_to(
    demo_pairs: dict[str, tuple[Path, Path]], workers_at_once: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []

    def idle_pool(processes: int, initializer: object = None, initargs: tuple[object, ...] = ()) -> _IdleWorkers:
        started.append(processes)
        return _IdleWorkers(processes)

    monkeypatch.setattr(multiprocessing.get_context("spawn"), "Pool", idle_pool)
    native, oracle = demo_pairs["swiglu-order"]
    with open_capture(native) as n, open_capture(oracle) as o:
        alone = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
        steps, split = _steps_and_result(iter_compare(n, o, CompareOptions(workers=3)))
    assert started == [2]
    assert dumps(split) == dumps(alone)
    shared = [s for s in steps if s.label == "comparing on 3 processes"]
    assert [s.done for s in shared] == sorted(s.done for s in shared)
    assert shared[-1].done == shared[-1].total


def test_a_comparison_one_process_finishes_quickly_starts_no_workers(
    demo_pairs: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pool(*args: object, **kwargs: object) -> None:
        raise AssertionError("workers were started for a comparison one process finishes in well under a second")

    monkeypatch.setattr(multiprocessing.get_context("spawn"), "Pool", no_pool)
    alone, split, labels = _alone_and_on_workers(demo_pairs["swiglu-order"], 4)
    assert dumps(split) == dumps(alone)
    assert not any("processes" in label for label in labels)
    assert multiprocessing.active_children() == []


def test_workers_do_not_start_when_shipping_them_the_pairs_costs_more_than_comparing_them(
    demo_pairs: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run's many small records cost more to pickle and unpickle than to compare: workers
    that started at once anyway made a 240,000-record report twice as slow."""

    def no_pool(*args: object, **kwargs: object) -> None:
        raise AssertionError("workers were started though shipping them the pairs costs more than the rest of the comparison")

    monkeypatch.setattr(parallel_compare, "SPAWN_WHEN_LEFT_S", 0.0)
    monkeypatch.setattr(parallel_compare, "MEASURE_S", 0.0)
    monkeypatch.setattr(parallel_compare, "SHIP_S_PER_PAIR", 1.0)
    monkeypatch.setattr(multiprocessing.get_context("spawn"), "Pool", no_pool)
    alone, split, labels = _alone_and_on_workers(demo_pairs["swiglu-order"], 4)
    assert dumps(split) == dumps(alone)
    assert not any("processes" in label for label in labels)


class _GaveUpWorkers(_IdleWorkers):
    """A pool whose every task came back empty: each worker found its shard already claimed."""

    def ready(self) -> bool:
        return True

    def successful(self) -> bool:
        return True

    def get(self) -> None:
        return None


def test_progress_never_counts_a_shard_twice_when_this_process_took_it_from_a_worker(
    demo_pairs: dict[str, tuple[Path, Path]], workers_at_once: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(multiprocessing.get_context("spawn"), "Pool", lambda processes, initializer=None, initargs=(): _GaveUpWorkers(processes))
    native, oracle = demo_pairs["swiglu-order"]
    with open_capture(native) as n, open_capture(oracle) as o:
        steps, _ = _steps_and_result(iter_compare(n, o, CompareOptions(workers=2)))
    shared = [s for s in steps if s.label == "comparing on 2 processes"]
    assert shared and max(s.done for s in shared) == shared[-1].total
    assert [s.done for s in shared] == sorted(s.done for s in shared)


def test_the_rate_that_starts_workers_is_the_recent_one_so_a_run_that_slows_down_gets_them_at_once() -> None:
    rate = _RecentRate(0.0)
    total, done, now = 10**10, 0, 0.0
    while now < 2.0:  # identical records: 1 GB/s
        now, done = now + 0.01, done + 10**7
        rate.seconds_left(now, done, total)
    while now < 2.0 + RECENT_S * 1.2:  # diverged from here on: 1 MB/s
        now, done = now + 0.01, done + 10**4
        left = rate.seconds_left(now, done, total)
    assert left == pytest.approx((total - done) / 10**6, rel=0.25)
    assert left > 100 * (total - done) * now / done, "the average since the start would say a hundred times less"
