"""A checking child started before its file (`sessions.capture.spare_checker`): the viewer and the
commands that open captures keep one ready, so a first open does not wait for an interpreter to
import numpy and h5py. Each such child checks once and reports exactly as a fresh one does."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import h5py
import numpy as np
import pytest

from sessions.capture import format as cf
from sessions.capture import spare_checker
from sessions.capture.meta import CaptureMeta
from sessions.capture.structure_check import check_in_child, iter_check_in_child
from sessions.capture.writer import CaptureWriter
from sessions.progress import run_to_end
from tests.child_processes import children_of_this_process
from viewer.cli import main


def _capture(path: Path, records: int = 3, layout: str = "packed") -> Path:
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="spare"), layout=layout) as writer:
        for i in range(records):
            writer.add_tensor(f"t{i}", np.arange(16, dtype=np.float32), step=0, segment="prefill")
        writer.end_step()
    return path


def _alive(pid: int) -> bool:
    return pid in children_of_this_process()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the children through /proc")
def test_the_ready_child_checks_the_first_file_and_a_new_one_stands_ready_after_it(tmp_path: Path) -> None:
    spare_checker.prepare()
    first = spare_checker.ready_pid()
    assert first is not None and _alive(first)

    report = check_in_child(_capture(tmp_path / "ok.h5"))

    assert report.problems == [] and report.contents.startswith("3 records")
    second = spare_checker.ready_pid()
    assert second is not None and second != first and _alive(second)
    assert not _alive(first), "the child that checked is reaped, never given another file"
    spare_checker.stop()
    assert spare_checker.ready_pid() is None and not _alive(second)


def test_a_ready_child_finds_what_a_fresh_child_finds_in_a_damaged_file(tmp_path: Path) -> None:
    path = _capture(tmp_path / "damaged.h5")
    with h5py.File(path, "r+") as f:
        rows = f[cf.INDEX_PATH][()]
        rows["offset"][1] = 10_000
        f[cf.INDEX_PATH][...] = rows
    fresh = check_in_child(path)
    spare_checker.prepare()
    ready = check_in_child(path)

    assert fresh.problems and [(p.location, p.problem) for p in ready.problems] == [(p.location, p.problem) for p in fresh.problems]


def test_a_ready_child_that_crashes_while_checking_is_the_files_finding(tmp_path: Path) -> None:
    path = _capture(tmp_path / "crashing.h5", records=4000, layout="datasets")  # rows checked one by one: progress to wait for
    spare_checker.prepare()
    pid = spare_checker.ready_pid()
    assert pid is not None
    work = iter_check_in_child(path)
    checked = next(work)
    while checked.done == 0:
        checked = next(work)  # StopIteration here: the check ended before it could be interrupted
    os.kill(pid, signal.SIGSEGV)

    report = run_to_end(work)

    assert len(report.problems) == 1
    assert "crashed the checking process (SIGSEGV)" in report.problems[0].problem


def test_a_ready_child_killed_while_it_waited_is_replaced_and_the_file_is_not_blamed(tmp_path: Path) -> None:
    path = _capture(tmp_path / "fine.h5")
    spare_checker.prepare()
    pid = spare_checker.ready_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    report = check_in_child(path)

    assert report.problems == [] and report.contents.startswith("3 records")


def test_validate_keeps_a_child_ready_before_it_imports_what_it_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert spare_checker.ready_pid() is None
    path = _capture(tmp_path / "validated.h5")

    assert main(["validate", str(path)]) == 0

    assert "valid" in capsys.readouterr().out
    assert spare_checker.ready_pid() is not None, "validate keeps one ready for the next file it checks"
