"""Read-ahead: announces the coming bytes from a thread, never past its window, never blocking."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from sessions.capture import read_ahead
from sessions.capture.read_ahead import STEP_BYTES, ReadAhead

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux/BSD only")


def _until(condition, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


@pytest.fixture
def on_disk_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files just written here are in the page cache; these tests need them as if they were not."""
    monkeypatch.setattr(read_ahead, "_resident", lambda fd, offset: False)


def _advising() -> bool:
    return any(thread.name == "parity-xray read-ahead" and thread.is_alive() for thread in threading.enumerate())


def test_announcing_stops_at_the_window_and_resumes_as_bytes_are_consumed(tmp_path: Path, on_disk_only: None) -> None:
    data = tmp_path / "capture.h5"
    data.write_bytes(b"\0" * (10 * STEP_BYTES))
    ahead = ReadAhead([(str(data), 0, 10 * STEP_BYTES)], window=3 * STEP_BYTES)
    try:
        assert _until(lambda: ahead.advised == 3 * STEP_BYTES)
        time.sleep(0.05)
        assert ahead.advised == 3 * STEP_BYTES
        ahead.consumed(2 * STEP_BYTES)
        assert _until(lambda: ahead.advised == 5 * STEP_BYTES)
        ahead.consumed(10 * STEP_BYTES)
        assert _until(lambda: ahead.advised == 10 * STEP_BYTES)
    finally:
        ahead.close(wait=True)


def test_closing_ends_a_thread_that_waits_for_its_window(tmp_path: Path, on_disk_only: None) -> None:
    data = tmp_path / "capture.h5"
    data.write_bytes(b"\0" * (4 * STEP_BYTES))
    ahead = ReadAhead([(str(data), 0, 4 * STEP_BYTES)], window=STEP_BYTES)
    assert _until(lambda: ahead.advised == STEP_BYTES)
    ahead.close(wait=True)
    assert ahead.advised == STEP_BYTES


def test_missing_files_directories_and_fifos_are_passed_over_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    spans = [(str(tmp_path / "absent.h5"), 0, STEP_BYTES), (str(tmp_path), 0, STEP_BYTES), (str(fifo), 0, 2 * STEP_BYTES)]
    ahead = ReadAhead(spans, window=100 * STEP_BYTES)
    assert _until(lambda: ahead.advised == 4 * STEP_BYTES)
    ahead.close(wait=True)


def test_spans_already_in_the_page_cache_are_not_advised(tmp_path: Path) -> None:
    data = tmp_path / "capture.h5"
    data.write_bytes(b"\1" * (10 * STEP_BYTES))
    data.read_bytes()
    ahead = ReadAhead([(str(data), offset, STEP_BYTES) for offset in range(0, 10 * STEP_BYTES, STEP_BYTES)], window=3 * STEP_BYTES)
    assert _until(lambda: not _advising())
    assert ahead.advised == 0
    ahead.close(wait=True)


def test_a_probe_that_finds_the_spans_resident_starts_no_thread_so_bytes_let_go_later_stay_gone(tmp_path: Path) -> None:
    """The probe runs before the constructor returns: in the thread, it ran after a comparison
    larger than memory had let its first bytes go, and advised them back (a flaky page test)."""
    data = tmp_path / "capture.h5"
    data.write_bytes(b"\1" * (4 * STEP_BYTES))
    data.read_bytes()
    ahead = ReadAhead([(str(data), 0, 4 * STEP_BYTES)], window=4 * STEP_BYTES)
    assert not _advising()
    with data.open("rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    ahead.close(wait=True)
    assert ahead.advised == 0


def test_a_file_on_the_disk_only_is_advised(tmp_path: Path) -> None:
    """The file is written and dropped from the page cache on one CPU: Linux drops only pages
    whose LRU batch is drained, and `DONTNEED` drains the calling CPU's (a write that migrates
    between CPUs can leave pages resident; one run of the parallel suite failed here)."""
    data = tmp_path / "capture.h5"
    pinned = hasattr(os, "sched_setaffinity")
    cpus = os.sched_getaffinity(0) if pinned else set()
    if pinned:
        os.sched_setaffinity(0, {min(cpus)})
    try:
        with data.open("wb") as handle:
            handle.write(b"\1" * (10 * STEP_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            if read_ahead._resident(handle.fileno(), 5 * STEP_BYTES):
                pytest.skip("this file system keeps every file in memory (tmpfs), or cannot tell")
    finally:
        if pinned:
            os.sched_setaffinity(0, cpus)
    ahead = ReadAhead([(str(data), 0, 10 * STEP_BYTES)], window=3 * STEP_BYTES)
    try:
        # Each advice reads its 4 MiB from the disk, which other tests' writes may keep busy.
        assert _until(lambda: ahead.advised == 3 * STEP_BYTES, timeout_s=60)
    finally:
        ahead.close(wait=True)


def test_spans_the_caller_has_consumed_already_are_not_advised(tmp_path: Path, on_disk_only: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that fell behind (a full device queue) goes on from where the caller is: a
    comparison of a pair larger than memory has let the bytes behind it go of the page cache,
    and advice for them read them back in."""
    data = tmp_path / "capture.h5"
    data.write_bytes(b"\0" * (10 * STEP_BYTES))
    advised: list[int] = []
    real = os.posix_fadvise

    def recorded(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            advised.append(offset)
        real(fd, offset, length, advice)

    monkeypatch.setattr(read_ahead.os, "posix_fadvise", recorded)
    ahead = ReadAhead([(str(data), 0, 10 * STEP_BYTES)], window=3 * STEP_BYTES)
    try:
        assert _until(lambda: ahead.advised == 3 * STEP_BYTES)
        ahead.consumed(8 * STEP_BYTES)
        assert _until(lambda: ahead.advised == 10 * STEP_BYTES)
        assert _until(lambda: len(advised) == 5)
    finally:
        ahead.close(wait=True)
    assert advised == [0, STEP_BYTES, 2 * STEP_BYTES, 8 * STEP_BYTES, 9 * STEP_BYTES]
