"""A writer that dies mid-run leaves a file that opens, shows its finished steps, and says it is unfinished.

A SIGKILL leaves on disk exactly the writes the process had issued, so the strongest check is
exhaustive: record every write libhdf5 makes for a real writer (through h5py's file-object
driver, which sees the same writes in the same order as the default one), then rebuild the file
as it stands after each of them and open it. A torn group or table shows up as a prefix that
does not open; a random kill finds such a prefix about once in a hundred tries.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from sessions.capture import writer as writer_module
from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.reader import CaptureError, load_capture
from sessions.capture.released_tail import RELEASED_TAIL_MAX_BYTES
from sessions.capture.structure_check import check_here
from sessions.capture.writer import CaptureWriter

ROWS_PER_STEP = 6
ROOT = Path(__file__).resolve().parent.parent


def expected_values(step: int, i: int) -> np.ndarray:
    return np.full((8, 64), step * 100 + i, np.float32)


def write_step(writer: CaptureWriter, step: int) -> None:
    for i in range(ROWS_PER_STEP):
        seq = writer.add_tensor(f"l_out-{i}", expected_values(step, i), step=step, segment="decode", layer=i)
        if i == 0:
            writer.add_dispatch(index_seq=seq, call=0, kv_group=-1, head_start=0, head_count=4, q_heads=4, kv_heads=1,
                                q_rows=1, kv_len=step + 1, head_dim=64, primitive="fallback")
    writer.add_token(step=step, segment="decode", token_id=step, is_stop=False)


class RecordingFile(io.RawIOBase):
    """A real file on disk that remembers every write and truncation, in order."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._file = open(path, "w+b")  # noqa: SIM115  (closed by close())
        self.ops: list[tuple[int, bytes | int]] = []

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer: Any) -> int:
        return self._file.readinto(buffer)

    def write(self, data: Any) -> int:
        raw = bytes(data)
        self.ops.append((self._file.tell(), raw))
        return self._file.write(raw)

    def truncate(self, size: int | None = None) -> int:
        size = self._file.tell() if size is None else size
        self.ops.append((size, -1))
        return self._file.truncate(size)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        super().close()


@contextmanager
def recording_writes() -> Iterator[list[RecordingFile]]:
    """Every h5py file opened for writing inside the block goes through a RecordingFile."""
    real_file = h5py.File
    opened: list[RecordingFile] = []

    def file(name: str | Path, mode: str = "r", **kwargs: Any) -> h5py.File:
        if mode != "w":
            return real_file(name, mode, **kwargs)
        opened.append(RecordingFile(str(name)))
        kwargs.pop("locking", None)
        return real_file(opened[-1], mode, **kwargs)

    h5py.File = file  # type: ignore[misc]
    try:
        yield opened
    finally:
        h5py.File = real_file  # type: ignore[misc]


def shown_steps(path: Path) -> int:
    """How many whole steps the file shows, after checking everything a viewer would read."""
    report = check_here(path)
    assert report.problems == [], report.problems
    with load_capture(path) as capture:
        assert capture.complete is False
        steps = len(capture.records) // ROWS_PER_STEP
        assert len(capture.records) == steps * ROWS_PER_STEP, "a torn step is shown"
        for record in capture.records:
            expected = expected_values(record.step, int(record.name.split("-")[1]))
            assert np.array_equal(capture.read_values(record), expected), record.path
        assert steps - 1 <= len(capture.tokens) <= steps, "tokens are committed right after their step's records"
        assert len(capture.dispatch) <= steps
        assert capture.describe().startswith("incomplete: the writer did not finish")
    return steps


def test_a_writer_killed_after_any_write_leaves_a_readable_incomplete_prefix(tmp_path: Path) -> None:
    final = tmp_path / "capture.h5"
    ends: list[int] = []
    with recording_writes() as opened:
        writer = CaptureWriter(final, CaptureMeta(role="native", engine_name="killed"))
        created = len(opened[0].ops)
        for step in range(4):
            write_step(writer, step)
            writer.end_step()
            ends.append(len(opened[0].ops))
        writer.add_tensor("l_out-0", expected_values(4, 0), step=4, segment="decode", layer=0)
        ops = list(opened[0].ops)
        writer.abandon()
    image = tmp_path / "as-killed.h5"
    fd = os.open(image, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        for done, (offset, data) in enumerate(ops, start=1):
            if isinstance(data, bytes):
                os.pwrite(fd, data, offset)
            else:
                os.ftruncate(fd, offset)
            if done < created:
                continue  # still under its temporary name: nothing is at the capture's path yet
            finished = sum(1 for end in ends if end <= done)
            steps = shown_steps(image)
            assert finished <= steps <= finished + 1, f"after write {done} of {len(ops)}"
    finally:
        os.close(fd)
    assert shown_steps(image) == 4


ENDLESS_WRITER = f"""
import sys
import numpy as np
import sessions
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter

writer = CaptureWriter(sys.argv[1], CaptureMeta(role="native", engine_name="killed"), compression=sys.argv[2] or None)
step = 0
while True:
    for i in range({ROWS_PER_STEP}):
        writer.add_tensor(f"l_out-{{i}}", np.full((8, 64), step * 100 + i, np.float32), step=step, segment="decode", layer=i)
    writer.add_token(step=step, segment="decode", token_id=step, is_stop=False)
    writer.end_step()
    print(step, flush=True)
    step += 1
"""


def run_and_kill(path: Path, steps_before_kill: int, extra_delay_s: float, compression: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with subprocess.Popen(
        [sys.executable, "-c", ENDLESS_WRITER, str(path), compression], stdout=subprocess.PIPE, text=True, env=env
    ) as child:
        assert child.stdout is not None
        for _ in range(steps_before_kill):
            assert child.stdout.readline(), "the writer stopped before it was killed"
        time.sleep(extra_delay_s)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize(
    ("steps_before_kill", "extra_delay_s", "compression"),
    [(3, 0.0, ""), (5, 0.011, "gzip"), (3, 0.027, "lzf")],
)
def test_a_sigkilled_writer_process_leaves_a_readable_clearly_incomplete_prefix(
    tmp_path: Path, steps_before_kill: int, extra_delay_s: float, compression: str
) -> None:
    path = tmp_path / "killed.h5"
    run_and_kill(path, steps_before_kill, extra_delay_s, compression)
    with open_capture(path) as capture:
        assert capture.complete is False
        steps = len(capture.records) // ROWS_PER_STEP
        assert steps >= steps_before_kill
        assert len(capture.records) == steps * ROWS_PER_STEP, "a torn step is shown"
        for record in capture.records:
            expected = record.step * 100 + int(record.name.split("-")[1])
            assert capture.read_values(record).tolist() == np.full((8, 64), expected, np.float32).tolist()
        assert capture.describe() in (
            f"incomplete: the writer did not finish; it holds {steps * ROWS_PER_STEP} records, "
            f"{steps} token steps, {tokens} tokens, 0 dispatch events"
            for tokens in (steps - 1, steps)
        )


def test_a_writer_killed_after_libhdf5_gave_back_the_end_of_its_file_but_before_its_superblock_said_so_shows_its_committed_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libhdf5 truncates the space it had set aside at the end of the file before it writes the
    superblock that says so: a SIGKILL between the two left a file 1,536 bytes shorter than its
    superblock, refused as "cut short" (the sigkill test above, 1 run in 27)."""
    path = tmp_path / "recording.h5"
    flushed: list[bytes] = []
    set_scalar = writer_module._set_scalar

    def remember_the_file(obj_id: h5py.h5o.ObjectID, name: str, value: np.ndarray) -> None:
        flushed.append(path.read_bytes() if path.exists() else b"")  # each commit follows a flush
        set_scalar(obj_id, name, value)

    monkeypatch.setattr(writer_module, "_set_scalar", remember_the_file)
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="killed"), compression="gzip") as writer:
        for step in range(40):
            write_step(writer, step)
            flushed.clear()
            writer.end_step()
            size = path.stat().st_size
            released = [state for state in flushed if len(state) > size]
            if released:
                break
    assert released, "no flush gave back the end of the file"
    killed = tmp_path / "killed.h5"
    killed.write_bytes(released[0][:size])  # as the step's first commit found it, truncated: its superblock and commit not yet written
    assert (step, len(released[0]) - size) == (15, 1536)
    assert shown_steps(killed) == step
    with open_capture(killed) as capture:
        assert capture.describe() == f"incomplete: the writer did not finish; it holds {step * ROWS_PER_STEP} records, {step} token steps, {step} tokens, {step} dispatch events"


def test_a_file_short_of_more_than_a_released_tail_or_finished_is_cut_short(tmp_path: Path) -> None:
    files = {}
    for finish in ("abandon", "close"):
        path = tmp_path / f"{finish}.h5"
        writer = CaptureWriter(path, CaptureMeta(role="native", engine_name="copied"), compression="gzip")
        for step in range(4):
            write_step(writer, step)
            writer.end_step()
        getattr(writer, finish)()
        files[finish] = path.read_bytes()
    unfinished, finished = files["abandon"], files["close"]
    for whole, missing in ((unfinished, RELEASED_TAIL_MAX_BYTES + 1), (finished, 1)):
        cut = tmp_path / "cut.h5"
        cut.write_bytes(whole[: len(whole) - missing])
        with pytest.raises(CaptureError) as refused:
            load_capture(cut)
        assert refused.value.problem == f"cut short: {len(whole) - missing:,} of its {len(whole):,} bytes are there (a copy or download that did not finish)"


def test_abandoned_writer_file_is_incomplete_and_a_closed_one_complete(tmp_path: Path) -> None:
    for finish, complete in (("abandon", False), ("close", True)):
        path = tmp_path / f"{finish}.h5"
        writer = CaptureWriter(path, CaptureMeta(role="oracle"))
        writer.add_tensor("x", np.zeros(3, np.float32), step=0, segment="decode")
        writer.end_step()
        writer.add_tensor("x", np.zeros(3, np.float32), step=1, segment="decode")
        getattr(writer, finish)()
        with open_capture(path) as capture:
            assert capture.complete is complete
            assert len(capture.records) == (1 if finish == "abandon" else 2), "an abandoned writer's unfinished step is not committed"
            assert capture.describe().startswith("incomplete: the writer did not finish") is not complete


def test_a_prompt_no_reader_would_read_is_refused_before_writing_and_leaves_no_file(tmp_path: Path) -> None:
    """A reader refuses an attribute over 64 MiB: the writer does not write one."""
    path = tmp_path / "x.h5"
    with pytest.raises(ValueError) as raised:
        CaptureWriter(path, CaptureMeta(role="native", prompt="7 " * (33 * 1024**2)))
    assert str(raised.value) == f"{path}: its prompt is 69,206,016 bytes, over the 64 MiB an attribute of a capture holds"
    assert list(tmp_path.iterdir()) == []


def test_a_run_interrupted_within_a_step_leaves_only_its_finished_steps(tmp_path: Path) -> None:
    """Ctrl-C between two records of an MLX recording's step kept that step's first records, without a token."""
    path = tmp_path / "stopped.h5"
    with pytest.raises(KeyboardInterrupt), CaptureWriter(path, CaptureMeta(role="native", engine_name="stopped")) as writer:
        for step in range(3):
            write_step(writer, step)
            writer.end_step()
        writer.add_tensor("l_out-0", expected_values(3, 0), step=3, segment="decode", layer=0)
        raise KeyboardInterrupt
    with open_capture(path) as capture:
        assert capture.describe() == f"incomplete: the writer did not finish; it holds {3 * ROWS_PER_STEP} records, 3 token steps, 3 tokens, 3 dispatch events"


def test_a_run_interrupted_inside_a_steps_commit_never_commits_calls_or_tokens_of_records_it_did_not_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Ctrl-C lands after the step's records were appended and before its calls were: closing
    the writer then committed the calls and the token of records it never committed, a file every
    reader refuses ("/dispatch row 1: index_seq 1 is not a record")."""
    from sessions.capture import writer as writer_module

    appended, pressed = writer_module._append_rows, []

    def interrupted(dataset: h5py.Dataset, rows: np.ndarray) -> None:
        if dataset.name == "/dispatch" and int(rows["index_seq"][0]) >= ROWS_PER_STEP and not pressed:
            pressed.append(True)  # one Ctrl-C
            raise KeyboardInterrupt
        appended(dataset, rows)

    monkeypatch.setattr(writer_module, "_append_rows", interrupted)
    path = tmp_path / "torn.h5"
    with pytest.raises(KeyboardInterrupt), CaptureWriter(path, CaptureMeta(role="native", engine_name="torn")) as writer:
        for step in range(2):
            write_step(writer, step)
            writer.end_step()
    with open_capture(path) as capture:
        assert capture.describe() == f"incomplete: the writer did not finish; it holds {ROWS_PER_STEP} records, 1 token steps, 1 tokens, 1 dispatch events"


LIVE_WRITER = """
import sys
import numpy as np
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter

writer = CaptureWriter(sys.argv[1], CaptureMeta(role="native", engine_name="live"))
for line in sys.stdin:
    step = int(line)
    seq = writer.add_tensor("l_out-0", np.full((1, 4), step, np.float32), step=step, segment="decode", layer=0)
    writer.add_dispatch(index_seq=seq, call=0, kv_group=-1, head_start=0, head_count=4, q_heads=4, kv_heads=1, q_rows=1, kv_len=step + 1, head_dim=64, primitive="fallback")
    writer.add_token(step=step, segment="decode", token_id=step, is_stop=False)
    writer.end_step()
    print("committed", flush=True)
writer.abandon()
"""


def test_a_recording_that_commits_a_step_while_its_tables_are_read_opens_consistent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index was read before the calls: a step committed in between left calls pointing past
    the index ("/dispatch row 1: index_seq 1 is not a record"), which `validate` reported of a
    recording it watched 1 time in 6."""
    from sessions.capture.reader import Capture

    path = tmp_path / "live.h5"
    root = Path(__file__).resolve().parent.parent
    with subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(path)], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as writer:
        assert writer.stdin is not None and writer.stdout is not None
        writer.stdin.write("0\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "committed\n"
        read_table, committed_between = Capture._read_table, []

        def one_step_committed_after_the_first_table(self: Capture, table: str, dtype: np.dtype, required: bool) -> np.ndarray:
            rows = read_table(self, table, dtype, required)
            if not committed_between:
                writer.stdin.write("1\n")  # type: ignore[union-attr]
                writer.stdin.flush()  # type: ignore[union-attr]
                committed_between.append(writer.stdout.readline())  # type: ignore[union-attr]
            return rows

        monkeypatch.setattr(Capture, "_read_table", one_step_committed_after_the_first_table)
        capture = load_capture(path)
        try:
            assert committed_between == ["committed\n"]
            assert (capture.dispatch["index_seq"] < len(capture.index)).all() and set(capture.tokens["step"]) <= set(capture.index["step"])
        finally:
            capture.close()


def test_a_file_shorter_than_its_superblock_says_that_grows_meanwhile_opens_and_one_that_does_not_is_cut_short(tmp_path: Path) -> None:
    """A recording's flush lengthens the file after its superblock is written: validate read such a file as a copy cut short."""
    import threading

    path = tmp_path / "growing.h5"
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="growing")) as writer:
        write_step(writer, 0)
        writer.end_step()
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - 4096])
    threading.Timer(0.03, path.write_bytes, (whole,)).start()
    with load_capture(path) as capture:
        assert len(capture.records) == ROWS_PER_STEP
    path.write_bytes(whole[: len(whole) - 4096])
    with pytest.raises(CaptureError, match="cut short"):
        load_capture(path)
