"""A file written where there is no room (a full disk, a file size limit) fails in one line
that names it, before libhdf5 itself fails: after its own failed write libhdf5 could neither flush
nor close the file, and the interpreter's exit crashed in its teardown (SIGSEGV).

The room runs out through RLIMIT_FSIZE, in a child process, which needs no privileges; the
writer counts a full device (statvfs) the same way."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sessions.atomic_write import (
    WriteFailed,
    atomic_write_all,
    atomic_write_bytes,
    new_file_beside,
)
from sessions.capture.opening import open_capture
from sessions.capture.writer import ROOM_MARGIN_BYTES, CaptureWriter
from sessions.child_env import PROJECT_ROOT, child_env
from sessions.file_room import FileUnwritable

LIMIT_BYTES = ROOM_MARGIN_BYTES + 3 * 1024**2
"""The file size limit of each child: room for the margin and about three 1 MiB steps."""


def _limited(command: list[str], limit: int = LIMIT_BYTES) -> subprocess.CompletedProcess[str]:
    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(command, cwd=PROJECT_ROOT, env=child_env(), capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size)


WRITE_STEPS = """
import sys
import numpy as np
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from sessions.file_room import FileUnwritable

written = 0
try:
    with CaptureWriter(sys.argv[1], CaptureMeta(role="native")) as writer:
        for step in range(20):
            writer.add_tensor("x", np.full((256, 1024), step, np.float32), step=step, segment="decode")
            writer.end_step()
            written += 1
except FileUnwritable as exc:
    print(written)
    print(exc)
"""


def test_a_writer_out_of_room_says_so_in_one_line_and_its_committed_steps_stay_readable(tmp_path: Path) -> None:
    path = tmp_path / "full.h5"
    done = _limited([sys.executable, "-c", WRITE_STEPS, str(path)])
    assert done.returncode == 0 and done.stderr == ""
    written, message = done.stdout.splitlines()
    assert message.startswith(f"{path}: cannot be written (no room left for it: ")
    assert message.endswith(
        f"; the next write takes {1024**2:,}, and 2 MiB more is kept for the file's own tables); "
        "the steps written before it stay readable, and the capture reads as incomplete"
    )
    with open_capture(path) as capture:
        assert not capture.complete
        assert [r.step for r in capture.records] == list(range(int(written)))
        assert 1 <= int(written) < 20
        assert np.array_equal(capture.read_values(capture.records[-1]), np.full((256, 1024), int(written) - 1, np.float32))


@pytest.mark.parametrize("limit", [20 * 1024, LIMIT_BYTES], ids=["no room for an empty capture", "room for some tensors"])
def test_import_out_of_room_is_one_line_and_leaves_no_file(tmp_path: Path, limit: int) -> None:
    dump, out = tmp_path / "dump.npz", tmp_path / "x.h5"
    np.savez(dump, **{f"layers.{i}.out": np.ones((256, 1024), np.float32) for i in range(8)})
    done = _limited([sys.executable, "-m", "viewer.cli", "import", "npz", str(dump), "--out", str(out)], limit)
    assert done.returncode == 2
    assert done.stderr.startswith(f"import refused: {out}: cannot be written (no room left for it: ") and done.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump.npz"], "no capture, and no hidden unfinished one"


@pytest.mark.slow
def test_rerun_save_out_of_room_is_one_line_and_keeps_the_file_it_would_have_replaced(tmp_path: Path, demo_pairs: dict) -> None:
    native, oracle = demo_pairs["swiglu-order"]
    saved = tmp_path / "rerun.h5"
    saved.write_bytes(b"an earlier rerun")
    command = [sys.executable, "-m", "viewer.cli", "rerun", "--op", "0:text-before:0:ffn_down", "--save", str(saved), str(native), str(oracle)]
    done = _limited(command, 256 * 1024)  # less than the saved capture takes (0.5 MB)
    assert done.returncode == 2
    assert done.stderr.startswith(f"parity-xray rerun: {saved}: cannot be written (no room left for it: ") and done.stderr.count("\n") == 1
    assert saved.read_bytes() == b"an earlier rerun"
    assert [p.name for p in tmp_path.iterdir()] == ["rerun.h5"]


def test_demo_generate_out_of_room_names_the_file_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = _limited([sys.executable, "-m", "viewer.cli", "demo", "--generate", str(out), "--scenario", "clean"], 300 * 1024)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"parity-xray demo: {out / 'demo-qwen3-tiny.safetensors'}: cannot be written (")
    assert done.stderr.endswith("bytes of room left there, on its device or under the file size limit)\n")
    assert list(out.iterdir()) == []


WRITE_TWO_OUTPUTS = """
import sys
from sessions.commands.arguments import write_outputs
small, big, made = sys.argv[1:4]
whole = lambda: "x" * 200_000
pieces = lambda: ("x" * 1000 for _ in range(200))  # a report's JSON: written as it is made
print(write_outputs([(small, lambda: "new summary"), (big, whole if made == "whole" else pieces)]))
"""


@pytest.mark.parametrize("made", ["whole", "in pieces"])
def test_outputs_are_written_all_or_none_when_the_room_runs_out_half_way(tmp_path: Path, made: str) -> None:
    small, big = tmp_path / "summary.json", tmp_path / "report.html"
    small.write_text("the last run's summary")
    big.write_text("the last run's report")
    done = _limited([sys.executable, "-c", WRITE_TWO_OUTPUTS, str(small), str(big), made], 100_000)
    assert done.stdout == f"cannot write {big}: File too large\n"
    assert small.read_text() == "the last run's summary", "not the new summary beside the last run's report"
    assert big.read_text() == "the last run's report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "summary.json"]


@pytest.mark.slow
def test_a_gate_whose_reports_do_not_fit_writes_none_and_leaves_no_empty_cases_folder(tmp_path: Path, demo_pairs: dict) -> None:
    (tmp_path / "runs").symlink_to(demo_pairs["clean"][0].parent, target_is_directory=True)
    manifest = tmp_path / "gate.toml"
    manifest.write_text('cases = "runs/*.native.h5"\noracle = "runs/*.oracle.h5"\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "gate.json").write_text("the last gate")
    command = [sys.executable, "-m", "viewer.cli", "gate", str(manifest), "--workers", "1", "--no-cache", "--json", str(out / "gate.json"), "--html", str(out / "gate.html")]
    done = _limited(command, 30 * 1024)  # a case's report is about 38 KB
    assert done.returncode == 2
    assert done.stderr.startswith(f"parity-xray gate: cannot write {out / 'gate-cases'}/") and done.stderr.endswith(": File too large\n")
    assert [p.name for p in out.iterdir()] == ["gate.json"] and (out / "gate.json").read_text() == "the last gate"


def test_a_complete_only_capture_whose_path_turns_out_to_be_a_folder_leaves_no_hidden_file(tmp_path: Path) -> None:
    from sessions.capture.meta import CaptureMeta

    taken = tmp_path / "out.h5"
    writer = CaptureWriter(taken, CaptureMeta(role="native"), complete_only=True)
    taken.mkdir()  # made while the capture was written
    writer.add_tensor("x", np.zeros(4, np.float32), step=0, segment="decode")
    with pytest.raises(FileUnwritable) as refused:
        writer.close()
    assert str(refused.value) == f"{taken}: cannot be written (Is a directory)"
    assert [p.name for p in tmp_path.iterdir()] == ["out.h5"] and taken.is_dir()


def test_outputs_a_rename_refuses_part_way_name_those_already_replaced(tmp_path: Path) -> None:
    first, second = tmp_path / "summary.json", tmp_path / "report.html"
    first.write_text("the last run's summary")
    second.mkdir()
    (second / "inside").write_text("a folder the rename cannot replace")  # made after the outputs were checked
    with pytest.raises(WriteFailed) as refused:
        atomic_write_all([(first, lambda: b"new summary"), (second, lambda: b"new report")])
    assert refused.value.filename == str(second) and refused.value.strerror.endswith(f"; already replaced: {first}")
    assert first.read_text() == "new summary"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "summary.json"], "no temp file left"


def test_the_temp_name_of_a_long_name_stays_valid_utf8_and_its_stale_temps_are_still_found(tmp_path: Path) -> None:
    path = tmp_path / ("a" * 199 + "é" * 20)  # 239 bytes; the temp repeats 200 of them, which would cut an é in half
    descriptor, temp = new_file_beside(path, ".tmp")
    os.close(descriptor)
    temp.name.encode("utf-8")  # macOS refuses names that are not UTF-8
    assert len(os.fsencode(temp.name)) <= 255
    atomic_write_bytes(path, b"saved")
    assert path.read_bytes() == b"saved" and temp.exists(), "a fresh temp is someone's save in progress"
    os.utime(temp, (0, 0))
    atomic_write_bytes(path, b"saved again")
    assert not temp.exists(), "a stale temp of the same name is found and removed"


def test_the_stale_temps_of_a_name_with_glob_characters_are_found_and_those_of_an_earlier_version_too(tmp_path: Path) -> None:
    path = tmp_path / "run [3].json"
    descriptor, temp = new_file_beside(path, ".tmp")
    os.close(descriptor)
    os.utime(temp, (0, 0))
    earlier = tmp_path / f".run [3].json.{'0123456789abcdef' * 2}.tmp"  # a backup's snapshot named by a whole UUID
    earlier.write_bytes(b"dead")
    os.utime(earlier, (0, 0))
    atomic_write_bytes(path, b"saved")
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "the dead saver's temp is removed"
