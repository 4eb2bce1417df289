"""The comparison run in a child process: same result as in-process, killed on cancel, crashes reported."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from sessions.capture.opening import open_capture
from sessions.capture.reader import CaptureError
from sessions.compare.align import ManualBreak
from sessions.compare.comparison import iter_compare
from sessions.compare.document import dumps
from sessions.compare.in_child import iter_compare_in_child
from sessions.compare.key import RecordKey
from sessions.compare.options import CompareOptions
from sessions.progress import run_to_end
from tests.child_processes import child_reading
from tests.hand_captures import T, write_capture

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the child through /proc")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Three layers; layer 1's native has one-ULP flips in row 3, the rest is bit-identical."""
    root = tmp_path_factory.mktemp("pair")
    rng = np.random.default_rng(5)
    oracle, native = [], []
    for layer in range(3):
        values = rng.standard_normal((64, 256), dtype=np.float32)
        flipped = values.copy()
        if layer == 1:
            flipped.view(np.uint32)[3, ::7] ^= 1
        oracle.append(T("layer_out", values, layer=layer))
        native.append(T("layer_out", flipped, layer=layer))
    return write_capture(root / "n.h5", "native", native), write_capture(root / "o.h5", "oracle", oracle)


def test_the_childs_comparison_is_the_in_process_one(pair: tuple[Path, Path]) -> None:
    native_path, oracle_path = pair
    options = CompareOptions(max_ulp=2, chunk_bytes=16 * 1024)
    work = iter_compare_in_child(native_path, oracle_path, options)
    progress = []
    while True:
        try:
            progress.append(next(work))
        except StopIteration as done:
            in_child = done.value
            break
    with open_capture(native_path) as native, open_capture(oracle_path) as oracle:
        in_process = run_to_end(iter_compare(native, oracle, options))
    assert dumps(in_child) == dumps(in_process)
    first = in_child.pairs[in_child.first_divergence]
    assert first.key.layer == 1 and first.metrics.differing == len(range(0, 256, 7)) and first.metrics.max_ulp == 1
    assert first.within_tolerance
    assert "aligning records" in [p.label for p in progress], "the child's own progress reaches the caller"


def test_manual_alignment_overrides_reach_the_child(pair: tuple[Path, Path]) -> None:
    broken = RecordKey(step=0, segment="prefill", layer=1, name="layer_out")
    options = CompareOptions(overrides=(ManualBreak(broken, "checked by hand"),))
    in_child = run_to_end(iter_compare_in_child(*pair, options))
    assert [p.key.layer for p in in_child.pairs] == [0, 2]
    assert {(u.side, u.layer) for u in in_child.unaligned} == {("native", 1), ("oracle", 1)}
    with open_capture(pair[0]) as native, open_capture(pair[1]) as oracle:
        assert dumps(in_child) == dumps(run_to_end(iter_compare(native, oracle, options)))


def test_the_sidecar_cache_is_used_when_a_folder_is_given(pair: tuple[Path, Path], tmp_path: Path) -> None:
    first = run_to_end(iter_compare_in_child(*pair, cache_dir=tmp_path))
    assert len(list(tmp_path.glob("*.json"))) == 1
    work = iter_compare_in_child(*pair, cache_dir=tmp_path)
    labels = []
    while True:
        try:
            labels.append(next(work).label)
        except StopIteration as done:
            again = done.value
            break
    assert "cached result" in labels and not any(label.startswith("step") for label in labels)
    assert dumps(again) == dumps(first)


@needs_proc
def test_closing_the_generator_kills_and_reaps_the_child(pair: tuple[Path, Path]) -> None:
    native_path, oracle_path = pair
    work = iter_compare_in_child(native_path, oracle_path)
    next(work)
    pid = child_reading(native_path)
    assert pid is not None, "the comparison never ran in a child process"
    work.close()
    assert not Path(f"/proc/{pid}").exists(), "the child outlived the cancelled comparison"
    assert child_reading(native_path) is None


@needs_proc
def test_a_child_killed_by_a_signal_is_a_clear_error_naming_the_files(pair: tuple[Path, Path]) -> None:
    native_path, oracle_path = pair
    work = iter_compare_in_child(native_path, oracle_path)
    next(work)
    pid = child_reading(native_path)
    assert pid is not None
    os.kill(pid, signal.SIGSEGV)
    with pytest.raises(CaptureError) as info:
        run_to_end(work)
    assert info.value.path == str(native_path)
    assert "crashed the comparing process (SIGSEGV)" in info.value.problem
    assert oracle_path.name in info.value.problem
    assert child_reading(native_path) is None


def test_a_capture_error_in_the_child_comes_back_as_that_error(pair: tuple[Path, Path], tmp_path: Path) -> None:
    missing = tmp_path / "gone.h5"
    with pytest.raises(CaptureError) as info:
        run_to_end(iter_compare_in_child(pair[0], missing))
    assert info.value.path == str(missing) and info.value.problem == "does not exist"
