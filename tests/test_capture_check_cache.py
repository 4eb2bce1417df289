"""The first open's structural check: remembered across processes, shown as progress, cancellable.

Every process (the viewer, each `parity-xray report` in CI) used to pay the check again; a pass
is now kept in the user cache directory ($PARITY_XRAY_CACHE_DIR in tests) for exactly that
version of the file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from sessions.capture import check_cache
from sessions.capture.hdf5_safety import DEFAULT_MEMORY_BUDGET
from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import iter_open_capture, open_capture
from sessions.capture.reader import CaptureError
from sessions.capture.structure_check import already_checked
from sessions.capture.writer import CaptureWriter
from sessions.progress import Progress
from tests.child_processes import children_of_this_process

ROOT = Path(__file__).resolve().parent.parent
MANY_ROWS = 3000

OPEN_AND_COUNT_CHECKS = """
import json, sys

spawned = []


def watch(event, args):
    if event == "subprocess.Popen" and "sessions.capture.structure_check" in [str(a) for a in args[1]]:
        spawned.append(args[1])


sys.addaudithook(watch)
from sessions.capture.reader import CaptureError
from sessions.capture.opening import open_capture

try:
    open_capture(sys.argv[1]).close()
    error = ""
except CaptureError as exc:
    error = str(exc)
print(json.dumps({"checks_spawned": len(spawned), "error": error}))
"""


def write(path: Path, rows: int = 4, layout: str = "packed") -> Path:
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="cache"), layout=layout) as writer:
        for seq in range(rows):
            writer.add_tensor(f"l_out-{seq % 4}", np.full((2, 8), seq, np.float32), step=seq // 100, segment="decode", layer=seq % 4)
            if seq % 100 == 99:
                writer.end_step()
        writer.end_step()
    return path


@pytest.fixture(scope="module")
def many_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each tensor a dataset of its own: the layout whose check takes long enough to report progress row by row."""
    return write(tmp_path_factory.mktemp("many") / "many.h5", MANY_ROWS, layout="datasets")


def open_in_a_new_process(path: Path) -> tuple[int, str]:
    """How many structure-check children a fresh interpreter spawns to open `path` (seen by an
    audit hook), and the CaptureError it got ("" when the file opened)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", OPEN_AND_COUNT_CHECKS, str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    return outcome["checks_spawned"], outcome["error"]


def checks_in_a_new_process(path: Path) -> int:
    spawned, error = open_in_a_new_process(path)
    assert error == ""
    return spawned


def touch(path: Path) -> None:
    later = path.stat().st_mtime_ns + 2 * 10**9
    os.utime(path, ns=(later, later))


def test_a_pass_is_remembered_across_processes_until_the_file_changes(tmp_path: Path) -> None:
    path = write(tmp_path / "run.h5")
    open_capture(path).close()
    assert checks_in_a_new_process(path) == 0
    touch(path)
    assert checks_in_a_new_process(path) == 1
    assert checks_in_a_new_process(path) == 0


def test_a_file_replaced_by_another_of_the_same_size_and_mtime_is_checked_again(tmp_path: Path) -> None:
    path = write(tmp_path / "run.h5")
    open_capture(path).close()
    assert already_checked(path)
    twin = tmp_path / "twin.h5"
    shutil.copyfile(path, twin)
    stat = path.stat()
    os.utime(twin, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(twin, path)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert not already_checked(path), "another inode is another file"


def test_passes_are_kept_in_the_cache_dir_never_beside_the_capture(tmp_path: Path) -> None:
    folder = tmp_path / "captures"
    folder.mkdir()
    path = write(folder / "run.h5")
    open_capture(path).close()
    assert sorted(p.name for p in folder.iterdir()) == ["run.h5"]
    assert check_cache.checked_dir() == Path(os.environ[check_cache.CACHE_DIR_ENV]) / "checked"
    identity = check_cache.identity_of(path, DEFAULT_MEMORY_BUDGET)
    entry = json.loads((check_cache.checked_dir() / identity.entry_name()).read_text())
    assert entry["path"] == str(path.resolve())
    assert (entry["size"], entry["mtime_ns"]) == (path.stat().st_size, path.stat().st_mtime_ns)


def test_a_pass_under_one_memory_budget_does_not_count_for_another(tmp_path: Path) -> None:
    path = write(tmp_path / "run.h5")
    open_capture(path).close()
    assert already_checked(path)
    assert not already_checked(path, memory_budget=2**20)


def test_a_failed_check_is_not_remembered(tmp_path: Path) -> None:
    path = write(tmp_path / "run.h5")
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 200)
    for _ in range(2):
        with pytest.raises(CaptureError, match="cut short: "):
            open_capture(path)
        assert not check_cache.passed_before(check_cache.identity_of(path, DEFAULT_MEMORY_BUDGET))
    spawned, error = open_in_a_new_process(path)
    assert spawned == 1 and "cut short: " in error


def test_an_unwritable_cache_only_means_checking_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv(check_cache.CACHE_DIR_ENV, str(blocker))
    path = write(tmp_path / "run.h5")
    with open_capture(path) as capture:
        assert len(capture.records) == 4
    assert not check_cache.passed_before(check_cache.identity_of(path, DEFAULT_MEMORY_BUDGET))


def test_the_first_open_of_a_large_capture_yields_rows_checked(many_rows: Path) -> None:
    work = iter_open_capture(many_rows)
    steps: list[Progress] = []
    while True:
        try:
            steps.append(next(work))
        except StopIteration as stop:
            capture = stop.value
            break
    with capture:
        assert len(capture.records) == MANY_ROWS
    counted = [p for p in steps if p.total]
    assert {p.total for p in counted} == {MANY_ROWS}
    assert counted[-1].done == MANY_ROWS
    assert len({p.done for p in counted}) >= 5, "progress moves while rows are checked"
    assert [p.done for p in steps] == sorted(p.done for p in steps)
    assert all(p.label == "checking many.h5" for p in steps)
    assert list(iter_open_capture(many_rows)) == [], "a file that passed opens without a check"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the children through /proc")
def test_closing_the_open_generator_kills_the_check_even_when_it_is_stuck(many_rows: Path, tmp_path: Path) -> None:
    path = tmp_path / "fresh.h5"
    shutil.copyfile(many_rows, path)
    work = iter_open_capture(path)
    first = next(work)
    assert first.label == "checking fresh.h5"
    checkers = [pid for pid, cmd in children_of_this_process().items() if str(path).encode() in cmd]
    assert checkers, "the check runs in a child process"
    for pid in checkers:
        os.kill(pid, signal.SIGSTOP)  # frozen, as a child hung inside libhdf5 would be
    closer = threading.Thread(target=work.close, daemon=True)
    closer.start()
    closer.join(20)
    try:
        assert not closer.is_alive(), "closing waited for a stuck check instead of killing it"
        assert not any(Path(f"/proc/{pid}").exists() for pid in checkers), "a checking child outlived the cancel"
        assert not already_checked(path)
    finally:
        for pid in checkers:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGCONT)
