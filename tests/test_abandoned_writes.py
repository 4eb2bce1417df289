"""A writer killed before it finished leaves a hidden file; the next writer of that path removes it and says so."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from sessions.atomic_write import new_file_beside
from sessions.capture import abandoned_writes
from sessions.capture.abandoned_writes import (
    UNLOCKED_GRACE_S,
    held_partial,
    remove_abandoned_writes,
)
from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.writer import CaptureWriter
from sessions.commands import import_dump as import_command
from viewer.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent

KILLED_IMPORT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from sessions.capture.meta import CaptureMeta
    from sessions.capture.writer import CaptureWriter
    writer = CaptureWriter(sys.argv[1], CaptureMeta(role="native"), complete_only=True)
    writer.add_tensor("l_out-0", np.zeros((64, 1024), np.float32), step=0, segment="prefill", layer=0)
    writer.end_step()
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _aged(path: Path) -> None:
    """As old as a file a writer killed a while ago left."""
    past = time.time() - UNLOCKED_GRACE_S - 5
    os.utime(path, (past, past))


def _hidden(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith("."))


def test_a_killed_import_leaves_a_hidden_file_that_the_next_import_of_that_path_removes_and_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.h5"
    killed = subprocess.run([sys.executable, "-c", KILLED_IMPORT, str(out)], cwd=ROOT, timeout=60, check=False)
    assert killed.returncode == -signal.SIGKILL
    (left,) = _hidden(tmp_path)
    assert left.name.startswith(".x.h5.") and left.name.endswith(".partial") and not out.exists()
    size = left.stat().st_size
    _aged(left)
    np.savez(tmp_path / "dump.npz", a=np.ones(3, np.float32))
    args = build_parser().parse_args(["import", "npz", str(tmp_path / "dump.npz"), "--out", str(out)])
    assert import_command.run(args) == import_command.EXIT_OK
    printed = capsys.readouterr().err
    assert f"import: removed {left.name} ({size:,} bytes), left beside {out} by an earlier write of it that was killed" in printed
    assert _hidden(tmp_path) == []
    with open_capture(out, check_in_child=False) as capture:
        assert [r.name for r in capture.records] == ["a"]


def test_the_hidden_file_of_a_writer_still_writing_is_never_removed(tmp_path: Path) -> None:
    out = tmp_path / "x.h5"
    with CaptureWriter(out, CaptureMeta(role="native"), complete_only=True) as writer:
        writer.add_tensor("a", np.ones(3, np.float32), step=0, segment="prefill", layer=0)
        (live,) = _hidden(tmp_path)
        _aged(live)
        assert remove_abandoned_writes(out) == []
        assert live.exists()
    assert _hidden(tmp_path) == [] and out.exists()


def test_a_fresh_unlocked_hidden_file_is_left_for_the_writer_about_to_lock_it(tmp_path: Path) -> None:
    left = tmp_path / ".x.h5.0123456789ab.partial"
    left.write_bytes(b"\0" * 10)
    assert remove_abandoned_writes(tmp_path / "x.h5") == []
    _aged(left)
    assert [(a.path.name, a.size) for a in remove_abandoned_writes(tmp_path / "x.h5")] == [(left.name, 10)]


def test_files_that_only_resemble_a_writers_hidden_file_are_kept(tmp_path: Path) -> None:
    kept = [
        tmp_path / ".x.h5.partial",  # no random part
        tmp_path / ".x.h5.0123456789AB.partial",  # not the writer's lower-case hex
        tmp_path / ".y.h5.0123456789ab.partial",  # another output's
        tmp_path / ".x.h5.0123456789ab.tmp",  # a saved JSON's temp, not a capture's
    ]
    for path in kept:
        path.write_bytes(b"keep")
        _aged(path)
    target = tmp_path / "someone-elses.h5"
    target.write_bytes(b"keep")
    _aged(target)
    os.symlink(target, tmp_path / ".x.h5.aaaaaaaaaaaa.partial")
    assert remove_abandoned_writes(tmp_path / "x.h5") == []
    assert all(path.exists() for path in kept) and (tmp_path / ".x.h5.aaaaaaaaaaaa.partial").is_symlink() and target.read_bytes() == b"keep"


def test_a_writer_removes_what_killed_writers_of_its_path_left(tmp_path: Path) -> None:
    left = tmp_path / ".x.h5.0123456789ab.partial"
    left.write_bytes(b"\0" * 4)
    _aged(left)
    with CaptureWriter(tmp_path / "x.h5", CaptureMeta(role="native")) as writer:
        assert [a.path for a in writer.abandoned] == [left]
    assert not left.exists()


def test_a_recording_in_progress_opens_in_a_reader_that_locks_files_as_h5py_does_by_default(tmp_path: Path) -> None:
    """The hidden file's lock went with it to the published path, where h5py's default open failed ("unable to lock file")."""
    out = tmp_path / "x.h5"
    with CaptureWriter(out, CaptureMeta(role="native")) as writer:
        writer.add_tensor("a", np.ones(3, np.float32), step=0, segment="prefill", layer=0)
        writer.end_step()
        read = "import h5py, sys; print(int(h5py.File(sys.argv[1], 'r').attrs['complete']))"  # another process: h5py's own default, locking on
        done = subprocess.run([sys.executable, "-c", read, str(out)], capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr[-300:]


def test_outputs_whose_long_names_share_their_first_200_bytes_never_take_each_others_hidden_files(tmp_path: Path) -> None:
    first, second = tmp_path / f"{'a' * 210}-first.h5", tmp_path / f"{'a' * 210}-second.h5"
    descriptor, left = held_partial(first)
    os.close(descriptor)
    _aged(left)
    assert len(os.fsencode(left.name)) <= 255
    assert remove_abandoned_writes(second) == [] and left.exists()
    assert [a.path for a in remove_abandoned_writes(first)] == [left]


def test_a_new_hidden_file_that_another_writers_clean_up_holds_or_removed_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, made, holders = tmp_path / "x.h5", [], []

    def new_file(output: Path, suffix: str) -> tuple[int, Path]:
        descriptor, partial = new_file_beside(output, suffix)
        made.append(partial)
        if len(made) == 1:  # a clean-up with a clock far off has locked it, about to remove it
            holders.append(os.open(partial, os.O_RDONLY))
            fcntl.flock(holders[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        elif len(made) == 2:  # a clean-up has removed it already
            partial.unlink()
        return descriptor, partial

    monkeypatch.setattr(abandoned_writes, "new_file_beside", new_file)
    descriptor, partial = held_partial(path)
    try:
        assert partial == made[2] and partial.exists()
        holders.append(os.open(partial, os.O_RDONLY))
        with pytest.raises(BlockingIOError):
            fcntl.flock(holders[1], fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        for open_file in (descriptor, *holders):
            os.close(open_file)
